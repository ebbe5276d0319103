// The CLI's text arguments: --params shape lists and --set keyword options. Both throw optjit::Error naming the
// text and the rule; whether the values make sense (a shape's size, an option's range) is checked where they are
// used (Tensor::empty, the optimizer's validation), with the same errors as from the API.
#pragma once

#include "frontend/optim/registry.h"
#include "runtime/tensor.h"

#include <string>
#include <vector>

namespace optjit {

// "10x10,10,10x10,10" -> {{10, 10}, {10}, {10, 10}, {10}}; "" or "scalar" is a 0-d shape.
std::vector<Shape> parse_shape_list(const std::string& text);
// "lr=0.01,amsgrad=true,betas=(0.8,0.9)" -> keyword options; commas inside parentheses separate a pair.
KeywordOptions parse_keyword_options(const std::string& text);

} // namespace optjit
