// PyTorch's timings beside optjit bench's own: tools/bench_torch.py run by a Python that has torch, its JSON read
// back. Never part of the build or the tests; where no such Python is found the anchors are skipped, saying why.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace optjit {

// `$OPTJIT_TORCH_PYTHON` (default python3) running `$OPTJIT_TORCH_BENCH` (default tools/bench_torch.py in the source
// tree) with `arguments`: its JSON object, or {"skipped": why}.
nlohmann::json torch_anchors(const std::string& arguments);

} // namespace optjit
