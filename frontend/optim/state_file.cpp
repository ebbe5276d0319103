#include "frontend/optim/state_file.h"
#include "frontend/optim/json_text.h"
#include "runtime/error.h"

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

namespace optjit {
namespace {

static_assert(std::endian::native == std::endian::little, "state files store tensors little-endian");

constexpr const char* kFormat = "optjit-optimizer-state";
constexpr const char* kVersion = "1";

using nlohmann::json;

json option_value(double v) {
  if (std::isfinite(v))
    return v;
  return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
}

double option_value(const json& v, const std::string& name) {
  if (v.is_number())
    return v.get<double>();
  if (v.is_string()) {
    const std::string text = v.get<std::string>();
    if (text == "nan")
      return std::nan("");
    if (text == "inf" || text == "-inf")
      return text == "inf" ? HUGE_VAL : -HUGE_VAL;
  }
  throw Error(fmt::format("option '{}' is {}, not a number", name, json_value_text(v)));
}

Dtype dtype_of_code(const std::string& code, const std::string& tensor) {
  if (std::optional<Dtype> dtype = dtype_from_safetensors_code(code))
    return *dtype;
  throw Error(fmt::format("tensor '{}' has dtype {}; optimizer state is {}", tensor, code, dtype_safetensors_codes()));
}

// "state.<id>.<key>" -> (id, key).
std::pair<int64_t, std::string> split_tensor_name(const std::string& name) {
  const std::string prefix = "state.";
  const auto dot = name.find('.', prefix.size());
  if (name.rfind(prefix, 0) != 0 || dot == std::string::npos || dot == prefix.size() || dot + 1 == name.size())
    throw Error(fmt::format("tensor '{}' is not named state.<param id>.<key>", name));
  const std::string id = name.substr(prefix.size(), dot - prefix.size());
  if (id.find_first_not_of("0123456789") != std::string::npos)
    throw Error(fmt::format("tensor '{}' is not named state.<param id>.<key>", name));
  // One spelling per id: "state.00.step" beside "state.0.step" would name one entry twice.
  if (id.size() > 1 && id[0] == '0')
    throw Error(fmt::format(
        "tensor '{}' writes param id {} with a leading zero; ids are written as {}", name, id,
        id.substr(id.find_first_not_of('0') == std::string::npos ? id.size() - 1 : id.find_first_not_of('0'))));
  int64_t index = 0;
  const auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), index);
  if (ec != std::errc() || end != id.data() + id.size())
    throw Error(fmt::format("tensor '{}' names param id {}, which is not a param index", name, id));
  return {index, name.substr(dot + 1)};
}

StateDict parse(std::string_view bytes) {
  if (bytes.size() < 8)
    throw Error("shorter than the 8-byte header length");
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  if (header_size > kMaxStateFileHeaderBytes)
    throw Error(fmt::format("header length {} is more than the largest header, {} bytes (kMaxStateFileHeaderBytes)",
                            header_size, kMaxStateFileHeaderBytes));
  if (header_size > bytes.size() - 8)
    throw Error(fmt::format("header length {} runs past the end of the file ({} bytes)", header_size, bytes.size()));
  const json header = json::parse(bytes.substr(8, header_size)); // throws json::parse_error
  if (!header.is_object())
    throw Error(fmt::format("the header is {}, not a JSON object", json_value_text(header)));
  const std::string_view data = bytes.substr(8 + header_size);
  const json& meta = header.at("__metadata__");
  if (meta.value("format", "") != kFormat || meta.value("version", "") != kVersion)
    throw Error(fmt::format("metadata says format '{}' version '{}', expected '{}' version '{}'",
                            meta.value("format", ""), meta.value("version", ""), kFormat, kVersion));
  StateDict dict;
  dict.optimizer = meta.at("optimizer").get<std::string>();
  const json groups = json::parse(meta.at("param_groups").get<std::string>());
  if (!groups.is_array())
    throw Error(fmt::format("param_groups is {}, not an array of groups", json_value_text(groups)));
  for (std::size_t g = 0; g < groups.size(); ++g) {
    StateDict::Group group;
    for (const auto& [name, value] : groups[g].at("options").items())
      group.options[name] = option_value(value, name);
    const json& ids = groups[g].at("params");
    if (!ids.is_array())
      throw Error(fmt::format("param_groups[{}].params is {}, not an array of param ids", g, json_value_text(ids)));
    for (std::size_t i = 0; i < ids.size(); ++i)
      group.params.push_back(json_integer(ids[i], fmt::format("param_groups[{}].params[{}]", g, i), 0,
                                          std::numeric_limits<int64_t>::max()));
    if (const auto names = groups[g].find("param_names"); names != groups[g].end()) {
      if (!names->is_array())
        throw Error(
            fmt::format("param_groups[{}].param_names is {}, not an array of names", g, json_value_text(*names)));
      for (std::size_t i = 0; i < names->size(); ++i) {
        if (!(*names)[i].is_string())
          throw Error(
              fmt::format("param_groups[{}].param_names[{}] is {}, not a string", g, i, json_value_text((*names)[i])));
        group.param_names.push_back((*names)[i].get<std::string>());
      }
    }
    dict.param_groups.push_back(std::move(group));
  }
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__")
      continue;
    const auto [id, key] = split_tensor_name(name);
    const Dtype dtype = dtype_of_code(info.at("dtype").get<std::string>(), name);
    const Shape shape = json_shape(info.at("shape"), fmt::format("tensor '{}' shape", name));
    const json& offset_pair = info.at("data_offsets");
    if (!offset_pair.is_array() || offset_pair.size() != 2)
      throw Error(fmt::format("tensor '{}' data_offsets is {}, not [begin, end]", name, json_value_text(offset_pair)));
    const int64_t data_size = static_cast<int64_t>(data.size());
    const std::string where = fmt::format("tensor '{}' data_offsets", name);
    const uint64_t offsets[2] = {static_cast<uint64_t>(json_integer(offset_pair[0], where + "[0]", 0, data_size)),
                                 static_cast<uint64_t>(json_integer(offset_pair[1], where + "[1]", 0, data_size))};
    // The size the shape needs, checked against the data before anything is allocated.
    uint64_t nbytes = dtype_size(dtype);
    for (int64_t extent : shape) {
      if (extent < 0 || (extent > 0 && nbytes > data.size() / static_cast<uint64_t>(extent)))
        nbytes = UINT64_MAX; // negative or larger than the file: fails the check below
      else
        nbytes *= static_cast<uint64_t>(extent);
    }
    if (offsets[0] > offsets[1] || offsets[1] - offsets[0] != nbytes)
      throw Error(fmt::format("tensor '{}' (shape {}) has data_offsets [{}, {}], not the size of its shape", name,
                              shape_to_string(shape), offsets[0], offsets[1]));
    Tensor t = Tensor::empty(shape, dtype);
    if (t.nbytes() > 0)
      std::memcpy(t.data(), data.data() + offsets[0], t.nbytes());
    dict.state[id].emplace_back(key, t);
  }
  return dict;
}

} // namespace

StateDict parse_state_dict_bytes(std::string_view bytes) {
  try {
    return parse(bytes);
  } catch (const json::exception& e) { // nlohmann's errors become optjit's here, and only here
    throw Error(e.what());
  }
}

void save_state_dict(const StateDict& dict, const std::filesystem::path& path) {
  json groups = json::array();
  for (const StateDict::Group& g : dict.param_groups) {
    json options = json::object();
    for (const auto& [name, value] : g.options)
      options[name] = option_value(value);
    json saved = {{"options", options}, {"params", g.params}};
    if (!g.param_names.empty())
      saved["param_names"] = g.param_names;
    groups.push_back(std::move(saved));
  }
  json header = {
      {"__metadata__",
       {{"format", kFormat}, {"version", kVersion}, {"optimizer", dict.optimizer}, {"param_groups", groups.dump()}}}};
  std::string data;
  for (const auto& [id, state] : dict.state)
    for (const auto& [key, tensor] : state) {
      const Tensor t = tensor.is_contiguous() ? tensor : tensor.clone();
      header[fmt::format("state.{}.{}", id, key)] = {{"dtype", dtype_safetensors_code(t.dtype())},
                                                     {"shape", t.shape()},
                                                     {"data_offsets", {data.size(), data.size() + t.nbytes()}}};
      data.append(static_cast<const char*>(t.data()), t.nbytes());
    }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_size = text.size();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&header_size), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  out.close();
  if (!out)
    throw Error(fmt::format("cannot write the optimizer state file {}", path.string()));
}

StateDict load_state_dict_file(const std::filesystem::path& path) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error))
    throw Error(fmt::format("cannot read the optimizer state file {}: {}", path.string(),
                            std::filesystem::exists(path, error) ? "it is not a regular file" : "it does not exist"));
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(fmt::format("cannot read the optimizer state file {}", path.string()));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    return parse_state_dict_bytes(bytes);
  } catch (const Error& e) {
    throw Error(fmt::format("{} is not an optjit optimizer state file: {}", path.string(), e.what()));
  }
}

} // namespace optjit
