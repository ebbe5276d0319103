// Optimizer state dicts in files, in the safetensors layout (readable by any safetensors reader):
//
//   8 bytes      N, the header length, unsigned little-endian
//   N bytes      a JSON object, padded with spaces so the data starts 8-byte aligned:
//                  "__metadata__": {"format": "optjit-optimizer-state", "version": "1",
//                                   "optimizer": torch's class name,
//                                   "param_groups": a JSON text: [{"options": {name: number}, "params": [id],
//                                                                  "param_names": [name] (named groups only)}]}
//                  "state.<id>.<key>": {"dtype": "F32" | "F64", "shape": [...], "data_offsets": [begin, end]}
//   the data     every tensor's elements, row-major, little-endian, at [begin, end) from the data's start
//
// Numbers round-trip exactly (shortest decimal form); a non-finite option is the string "nan", "inf" or "-inf";
// flags are 0 or 1. Scalar state (step, mu_product, eta, mu) is a tensor of shape []. Saving then loading gives
// back the same state dict bit for bit, so a loaded optimizer continues a trajectory exactly.
#pragma once

#include "frontend/optim/optimizer.h"

#include <cstdint>
#include <filesystem>
#include <string_view>

namespace optjit {

// The largest JSON header a state file may have (safetensors' own limit): the header is parsed whole, in memory.
constexpr uint64_t kMaxStateFileHeaderBytes = uint64_t{100} << 20;

// Throws optjit::Error naming the path when the file cannot be written.
void save_state_dict(const StateDict& state_dict, const std::filesystem::path& path);
// Throws optjit::Error naming the path and the problem when the file is missing, truncated or not in the format.
StateDict load_state_dict_file(const std::filesystem::path& path);
// The same from a file's bytes in memory (the loader's whole parse): throws optjit::Error naming the problem.
StateDict parse_state_dict_bytes(std::string_view bytes);

} // namespace optjit
