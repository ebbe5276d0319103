// Optimizers by torch's class name, with options by torch's keyword names, for the CLI and golden replay.
#pragma once

#include "frontend/optim/optimizer.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace optjit {

// Keyword options as torch takes them: a number, a flag (0 or 1) or a pair (betas, etas, step_sizes).
using KeywordOptions = std::map<std::string, std::vector<double>>;

// Makes `name` (torch's class name, any case) over `groups`, `options` applying to every group and each group's
// own options overriding them. Throws optjit::Error for an unknown or not yet implemented optimizer, an unknown
// option, or an invalid value (with torch's message).
std::unique_ptr<Optimizer> make_optimizer(const std::string& name, std::vector<ParamGroupSpec> groups,
                                          const KeywordOptions& options,
                                          const std::vector<KeywordOptions>& group_options = {});

// The optimizers optjit implements, by torch's class names.
std::vector<std::string> implemented_optimizers();

} // namespace optjit
