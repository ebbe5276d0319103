// Constructor and step validation with PyTorch's exact messages. Values are printed as Python prints a float
// (repr), so "Invalid learning rate: -0.01" reads as torch's does.
#pragma once

#include <map>
#include <string>

namespace optjit {

// Python's repr of a float: "1.0", "-0.5", "1e-08", "inf", "nan".
std::string python_float(double value);
// A count held as a double as Python prints the int a user gives ("256"), or python_float where it is no integer.
std::string python_count(double value);

// Throws optjit::Error("Invalid <what> value: <value>") unless 0 <= value (NaN fails, as `not 0.0 <= x`).
void require_non_negative(double value, const std::string& message_prefix);
// Throws unless 0 <= value < 1.
void require_beta(double value, int index);
// The checks Adam, AdamW, NAdam, RAdam and Adamax share, in torch's order: lr, eps, beta1, beta2, weight_decay.
void require_adam_options(const std::map<std::string, double>& options);
// At step time, for the steps that divide by the first bias correction 1 - beta1^step on the host (Adam, AdamW,
// Adamax): beta1 = 1 makes it 0, which torch's step meets with ZeroDivisionError (after changing its state); refused
// here before anything changes, where the kernels would write -inf.
void require_first_bias_correction(double beta1, const std::string& name, std::size_t group);

} // namespace optjit
