#include "frontend/optim/validation.h"
#include "runtime/error.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace optjit {

std::string python_count(double value) {
  if (value == std::floor(value) && std::fabs(value) < 1e15)
    return std::to_string(static_cast<int64_t>(value));
  return python_float(value);
}

std::string python_float(double value) {
  if (std::isnan(value))
    return "nan";
  if (std::isinf(value))
    return value > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then Python's layout: fixed for exponents in [-4, 16), scientific otherwise.
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  std::string sci(buffer, end);
  auto e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  int exponent = std::atoi(sci.c_str() + e + 1);
  bool negative = mantissa[0] == '-';
  std::string digits;
  for (char c : mantissa)
    if (std::isdigit(static_cast<unsigned char>(c)))
      digits += c;
  std::string sign = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1)
      m.append(".").append(digits, 1);
    std::string exp_digits = std::to_string(std::abs(exponent));
    if (exp_digits.size() < 2)
      exp_digits.insert(0, 1, '0');
    return sign + m + "e" + (exponent < 0 ? "-" : "+") + exp_digits;
  }
  if (exponent < 0)
    return sign + "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
  std::size_t int_len = static_cast<std::size_t>(exponent) + 1;
  if (digits.size() <= int_len)
    return sign + digits + std::string(int_len - digits.size(), '0') + ".0";
  return sign + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

void require_non_negative(double value, const std::string& message_prefix) {
  if (!(0.0 <= value))
    throw Error(message_prefix + python_float(value));
}

void require_beta(double value, int index) {
  if (!(0.0 <= value && value < 1.0))
    throw Error("Invalid beta parameter at index " + std::to_string(index) + ": " + python_float(value));
}

void require_adam_options(const std::map<std::string, double>& o) {
  require_non_negative(o.at("lr"), "Invalid learning rate: ");
  require_non_negative(o.at("eps"), "Invalid epsilon value: ");
  require_beta(o.at("beta1"), 0);
  require_beta(o.at("beta2"), 1);
  require_non_negative(o.at("weight_decay"), "Invalid weight_decay value: ");
}

void require_first_bias_correction(double beta1, const std::string& name, std::size_t group) {
  if (beta1 == 1.0)
    throw Error(name + ": param group " + std::to_string(group) +
                " has betas[0] = 1.0: the bias correction 1 - beta1^step is 0 and the step divides by it (torch's "
                "step raises ZeroDivisionError); a beta is in [0, 1)");
}

} // namespace optjit
