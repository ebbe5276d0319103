// optjit bench's Muon rows (tools/bench_muon.cpp): the compiled step over a Transformer's matrices against its
// products and its pointwise bytes run alone, and beside torch's Muon and torch.compile of it where torch is found.
#pragma once

#include <nlohmann/json.hpp>

namespace optjit {

// Prints the rows unless `as_json`; returns them (a step row, then torch's metrics).
nlohmann::json bench_muon(int layers, bool as_json);

} // namespace optjit
