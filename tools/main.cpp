// The optjit command line: demo, dump, run, counts, replay and bench (tools/commands.h and tools/ir_file.h do the
// work).
#include "runtime/error.h"
#include "tools/commands.h"
#include "tools/ir_file.h"
#include "tools/plugins.h"

#include <CLI/CLI.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  CLI::App app{"optjit: a tracing JIT compiler for deep-learning optimizer steps"};
  app.require_subcommand(1);
  std::vector<std::string> plugins;
  app.add_option("--plugin", plugins,
                 "a shared library that registers optimizers (tools/plugins.h); before the command, repeatable");

  auto* demo_cmd = app.add_subcommand("demo", "compile Adam for a 4-layer MLP and compare it with eager steps");
  std::string demo_device = "cpu";
  demo_cmd->add_option("--device", demo_device, "cpu or cuda[:N]: where the compiled step runs")->capture_default_str();

  optjit::DumpOptions dump;
  std::string dtype = "f32";
  auto* dump_cmd = app.add_subcommand("dump", "print one stage of the code generated for an optimizer");
  auto* optimizer_opt =
      dump_cmd->add_option("--optimizer", dump.optimizer, "torch's optimizer name (adam, adamw, sgd, ...)")
          ->capture_default_str();
  auto* set_opt = dump_cmd->add_option("--set", dump.set, "options, e.g. lr=0.01,amsgrad=true,betas=(0.8,0.9)");
  auto* params_opt =
      dump_cmd->add_option("--params", dump.params, "param shapes, e.g. 10x10,10,10x10,10")->capture_default_str();
  auto* dtype_opt = dump_cmd->add_option("--dtype", dtype, "f32, f64, bf16, f16, c64 or c128")->capture_default_str();
  dump_cmd->add_option("--stage", dump.stage, "traced, optimized, fused, llvm or ptx")->capture_default_str();
  std::string dump_device = "cpu";
  dump_cmd
      ->add_option("--device", dump_device, "cpu or cuda[:N]: the target of the llvm and ptx stages (no GPU needed)")
      ->capture_default_str();
  dump_cmd->add_option("--sm", dump.sm, "GPU target: 80 or 90 (default: the device's, or 80 without a GPU)")
      ->check(CLI::IsMember({0, 80, 90}));
  std::string dump_ir;
  dump_cmd->add_option("--ir", dump_ir, "an optimizer as IR text (instead of --optimizer): its code at --stage")
      ->excludes(optimizer_opt)
      ->excludes(set_opt)
      ->excludes(params_opt)
      ->excludes(dtype_opt);

  optjit::RunIrOptions run_ir;
  auto* run_cmd = app.add_subcommand("run", "run an optimizer written as IR text, compiled and interpreted");
  run_cmd->add_option("file", run_ir.file, "the IR file (the printer's format: optjit dump --stage traced)")
      ->required();
  run_cmd->add_option("--params", run_ir.params, "tensor shapes, e.g. 1000,37")->capture_default_str();
  run_cmd->add_option("--set", run_ir.set, "the graph's hyperparameters, e.g. lr=0.01,beta1=0.9");
  run_cmd->add_option("--steps", run_ir.steps, "steps to run")->capture_default_str();

  bool counts_json = false;
  auto* counts_cmd = app.add_subcommand("counts", "kernels per step for every known configuration");
  counts_cmd->add_flag("--json", counts_json, "print a JSON array");

  optjit::ReplayOptions replay;
  auto* replay_cmd = app.add_subcommand("replay", "replay golden trajectories recorded from torch.optim");
  replay_cmd->add_option("--mode", replay.mode, "forloop, eager, compiled or all")
      ->check(CLI::IsMember({"forloop", "eager", "compiled", "all"}))
      ->capture_default_str();
  replay_cmd->add_option("paths", replay.paths, "golden .json files or directories")->required();
  std::string replay_device = "cpu";
  replay_cmd->add_option("--device", replay_device, "cpu or cuda[:N] (cuda: compiled mode)")->capture_default_str();

  optjit::BenchOptions bench;
  auto* bench_cmd = app.add_subcommand(
      "bench", "compiled steps vs a memory-traffic probe (Muon: vs its products alone), compile and dispatch time");
  bench_cmd->add_flag("--json", bench.json, "print a JSON array");
  bench_cmd
      ->add_option(
          "--only", bench.only,
          "a section: pointwise (every pointwise optimizer, compile, dispatch), lowbit (block-quantized state), "
          "muon")
      ->check(CLI::IsMember({"all", "pointwise", "lowbit", "muon"}))
      ->capture_default_str();
  bench_cmd->add_option("--muon-layers", bench.muon_layers, "Muon's rows: the matrices of this many d=768 layers")
      ->check(CLI::Range(1, 96))
      ->capture_default_str();
  std::string bench_device = "cpu";
  bench_cmd->add_option("--device", bench_device, "cpu or cuda[:N]")->capture_default_str();

  // CLI11 says only "A subcommand is required" for a word that names none: name it.
  const auto names_a_command = [&](const char* word) {
    for (const CLI::App* command : app.get_subcommands({}))
      if (command->get_name() == word)
        return true;
    return false;
  };
  if (argc > 1 && argv[1][0] != '-' && !names_a_command(argv[1])) {
    std::fprintf(stderr,
                 "optjit: unknown command '%s' (commands: demo, dump, run, counts, replay, bench; see --help)\n",
                 argv[1]);
    return static_cast<int>(CLI::ExitCodes::ExtrasError);
  }
  CLI11_PARSE(app, argc, argv);
  try {
    for (const std::string& plugin : plugins)
      optjit::load_plugin(plugin);
    if (app.got_subcommand("demo"))
      return optjit::run_demo(optjit::parse_device(demo_device));
    if (app.got_subcommand(dump_cmd)) {
      dump.dtype = optjit::parse_dtype(dtype);
      dump.device = optjit::parse_device(dump_device);
      if (!dump_ir.empty()) {
        std::fputs(optjit::dump_ir_file(dump_ir, optjit::parse_stage(dump.stage), dump.sm, dump.device).c_str(),
                   stdout);
        return 0;
      }
      return optjit::run_dump(dump);
    }
    if (app.got_subcommand(run_cmd))
      return optjit::run_ir_file(run_ir);
    if (app.got_subcommand(counts_cmd))
      return optjit::run_counts(counts_json);
    if (app.got_subcommand(replay_cmd)) {
      replay.device = optjit::parse_device(replay_device);
      return optjit::run_replay(replay);
    }
    if (app.got_subcommand(bench_cmd)) {
      bench.device = optjit::parse_device(bench_device);
      return bench.device.kind == optjit::DeviceKind::cuda ? optjit::run_bench_cuda(bench) : optjit::run_bench(bench);
    }
  } catch (const optjit::Error& e) {
    std::fprintf(stderr, "optjit: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    // Every library's errors become optjit::Error where optjit calls it; one that gets here is a bug to report,
    // not a reason to abort without a message.
    std::fprintf(stderr, "optjit: internal error: %s\n", e.what());
    return 3;
  }
  return 0;
}
