#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/error.h"

#include <charconv>
#include <vector>

namespace optjit {

namespace {

struct DtypeRow {
  Dtype dtype;
  std::string_view name, torch_name, safetensors_code;
};

constexpr DtypeRow kDtypes[] = {
#define OPTJIT_DTYPE(name, type, torch_name, safetensors_code) {Dtype::name, #name, torch_name, safetensors_code},
#include "runtime/dtypes.def"
#undef OPTJIT_DTYPE
};

// "a, b or c"
std::string spelled_out(const std::vector<std::string_view>& words) {
  std::string text;
  for (std::size_t i = 0; i < words.size(); ++i)
    text += std::string(i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + std::string(words[i]);
  return text;
}

} // namespace

std::string_view dtype_safetensors_code(Dtype dtype) {
  for (const DtypeRow& row : kDtypes)
    if (row.dtype == dtype)
      return row.safetensors_code;
  OPTJIT_ASSERT(false, "dtype missing from the dtype table");
}

std::optional<Dtype> dtype_from_safetensors_code(std::string_view code) {
  for (const DtypeRow& row : kDtypes)
    if (row.safetensors_code == code)
      return row.dtype;
  return std::nullopt;
}

std::string dtype_safetensors_codes() {
  std::vector<std::string_view> codes;
  for (const DtypeRow& row : kDtypes)
    codes.push_back(row.safetensors_code);
  return spelled_out(codes);
}

Dtype parse_dtype(std::string_view text) {
  std::vector<std::string_view> names, torch_names;
  for (const DtypeRow& row : kDtypes) {
    if (text == row.name || text == row.torch_name)
      return row.dtype;
    names.push_back(row.name);
    torch_names.push_back(row.torch_name);
  }
  names.insert(names.end(), torch_names.begin(), torch_names.end());
  throw Error("unknown dtype '" + std::string(text) + "': expected " + spelled_out(names));
}

std::string Device::to_string() const { return kind == DeviceKind::cpu ? "cpu" : "cuda:" + std::to_string(index); }

Device parse_device(std::string_view text) {
  if (text == "cpu")
    return Device::cpu();
  if (text == "cuda")
    return Device::cuda(0);
  if (text.starts_with("cuda:")) {
    int index = -1;
    auto digits = text.substr(5);
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && index >= 0)
      return Device::cuda(index);
  }
  throw Error("unknown device '" + std::string(text) + "': expected cpu, cuda or cuda:N");
}

} // namespace optjit
