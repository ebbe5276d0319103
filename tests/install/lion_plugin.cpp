// The same Lion (lion.h) as a CLI plugin (tools/plugins.h): `optjit --plugin ./liblion_plugin.so counts` then lists
// UserLion beside the built-ins, and dump and replay know it by name.
#include "frontend/optim/registry.h"
#include "lion.h"

extern "C" void optjit_register_plugin() { optjit::register_optimizer<user::Lion>("UserLion"); }
