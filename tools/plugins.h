// CLI plugins: shared libraries that register a user's optimizers with the optjit CLI, so that dump, counts and
// replay know them by name as they know the built-ins (`optjit --plugin ./libmy_optimizers.so counts`).
//
// A plugin is built against the installed headers with CMake's optjit::plugin target (headers only: it links none
// of optjit's libraries, whose one copy is the CLI's, so a registration lands in the CLI's registry) and defines
//     extern "C" void optjit_register_plugin() { optjit::register_optimizer<MyOptimizer>("MyOptimizer"); }
// which load_plugin calls once. The CLI exports optjit's symbols to it (tools/plugin_exports.list).
#pragma once

#include <string>

namespace optjit {

// The symbol every plugin defines.
inline constexpr const char* kPluginEntry = "optjit_register_plugin";

// Loads the plugin at `path` and calls its optjit_register_plugin. Throws optjit::Error naming the path when it
// cannot be loaded (dlerror's reason), when it has no entry point, and with the entry's own error when registering
// fails (a name optjit already has).
void load_plugin(const std::string& path);

} // namespace optjit
