#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/error.h"

#include <charconv>

namespace optjit {

Dtype parse_dtype(std::string_view text) {
  if (text == "f32" || text == "float32")
    return Dtype::f32;
  if (text == "f64" || text == "float64")
    return Dtype::f64;
  throw Error("unknown dtype '" + std::string(text) + "': expected f32, f64, float32 or float64");
}

std::string Device::to_string() const {
  return kind == DeviceKind::cpu ? "cpu" : "cuda:" + std::to_string(index);
}

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
