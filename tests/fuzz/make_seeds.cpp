// Writes the fuzzers' seed corpora (tests/fuzz/corpus/, checked in): `fuzz_make_seeds DIR` fills DIR/state_file
// with a state file of every optimizer (two groups, after two steps; f32, f64, bf16 with master weights, complex),
// DIR/ir with the traced and optimized graphs and the kernel plans of every optimizer, and DIR/cli_text with dump
// arguments. The golden seeds are small cases copied from tests/golden (tests/fuzz/README.md). Run it again when a
// format changes.
#include "compiler/compiled_step.h"
#include "frontend/optim/registry.h"
#include "frontend/optim/state_file.h"
#include "tools/model.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace optjit;

namespace {

// torch's names with the options that switch on the most state.
const std::vector<std::pair<std::string, KeywordOptions>> kOptimizers = {
    {"Adam", {{"amsgrad", {1}}, {"weight_decay", {0.1}}}},
    {"AdamW", {{"amsgrad", {1}}}},
    {"SGD", {{"lr", {0.1}}, {"momentum", {0.9}}, {"nesterov", {1}}}},
    {"Adagrad", {{"lr_decay", {0.01}}}},
    {"Adadelta", {{"maximize", {1}}}},
    {"Adamax", {{"weight_decay", {0.1}}}},
    {"NAdam", {{"decoupled_weight_decay", {1}}, {"weight_decay", {0.1}}}},
    {"RAdam", {{"weight_decay", {0.1}}}},
    {"RMSprop", {{"centered", {1}}, {"momentum", {0.5}}}},
    {"Rprop", {{"maximize", {1}}}},
    {"ASGD", {{"t0", {1}}}},
    {"Lion", {{"weight_decay", {0.1}}}},
};

std::unique_ptr<Optimizer> stepped(const std::string& name, KeywordOptions options, Dtype dtype,
                                   std::vector<Tensor>& params) {
  params = random_params({{2, 3}, {4}, {3}}, dtype, 1);
  options["foreach"] = {1};
  auto opt = make_optimizer(name, {ParamGroupSpec{{params[0], params[1]}, {}}, ParamGroupSpec{{params[2]}, {}}},
                            options, {{}, {{"lr", {0.05}}}});
  for (int step = 0; step < 2; ++step) {
    randomize_grads(params, static_cast<uint64_t>(step));
    opt->step();
  }
  return opt;
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  for (const char* corpus : {"state_file", "ir", "cli_text"})
    std::filesystem::create_directories(dir / corpus);
  for (const auto& [name, options] : kOptimizers) {
    std::vector<Tensor> params;
    save_state_dict(stepped(name, options, Dtype::f32, params)->state_dict(), dir / "state_file" / (name + ".f32"));
    auto opt = stepped(name, options, Dtype::f32, params);
    CompiledStep step = compile(*opt);
    std::ofstream(dir / "ir" / (name + ".traced")) << step.dump(Stage::Traced);
    std::ofstream(dir / "ir" / (name + ".optimized")) << step.dump(Stage::Optimized);
    const std::string fused = step.dump(Stage::Fused); // the fusion report, then the kernel plans
    std::ofstream(dir / "ir" / (name + ".plan")) << fused.substr(fused.find("kernel @"));
    std::ofstream(dir / "cli_text" / name) << name << "\n10x10,10\n"
                                           <<
        [&] {
          std::string set;
          for (const auto& [key, values] : options)
            set += (set.empty() ? "" : ",") + key + "=" + std::to_string(values[0]);
          return set;
        }() << "\n";
  }
  std::vector<Tensor> params;
  save_state_dict(stepped("Adam", {{"weight_decay", {0.1}}}, Dtype::f64, params)->state_dict(),
                  dir / "state_file" / "Adam.f64");
  save_state_dict(stepped("AdamW", {{"master_weights", {1}}}, Dtype::bf16, params)->state_dict(),
                  dir / "state_file" / "AdamW.bf16_master");
  save_state_dict(stepped("Adam", {{"amsgrad", {1}}}, Dtype::c64, params)->state_dict(),
                  dir / "state_file" / "Adam.c64");
  std::ofstream(dir / "cli_text" / "pairs") << "adam\n3x4,scalar,5\nbetas=(0.8,0.9),lr=0.01,amsgrad=true\n";
  return 0;
}
