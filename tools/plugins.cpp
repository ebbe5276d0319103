#include "tools/plugins.h"
#include "runtime/error.h"

#include <dlfcn.h>

namespace optjit {

void load_plugin(const std::string& path) {
  // RTLD_NOW: a symbol the CLI does not export shows here, not midway through a command. RTLD_LOCAL: plugins do not
  // see each other's symbols. The handle stays open for the process: registered factories live in the library.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* reason = dlerror();
    throw Error("cannot load plugin '" + path + "': " + (reason ? reason : "unknown reason") +
                (path.find('/') == std::string::npos ? " (a path without '/' is searched for like a system library: "
                                                       "give ./" +
                                                           path + ")"
                                                     : ""));
  }
  auto* entry = reinterpret_cast<void (*)()>(dlsym(handle, kPluginEntry));
  if (!entry)
    throw Error("plugin '" + path + "' defines no " + kPluginEntry +
                "(): a plugin registers its optimizers there (extern \"C\" void " + kPluginEntry + "())");
  try {
    entry();
  } catch (const Error& e) {
    throw Error("plugin '" + path + "': " + e.what());
  }
}

} // namespace optjit
