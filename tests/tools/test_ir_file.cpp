// Optimizers as IR text: read_ir_file names the file and the line of what it refuses; dump_ir_file gives every
// stage; run_ir_file runs a graph compiled and interpreted and says whether they agree.
#include "helpers.h"
#include "tools/ir_file.h"

#include <filesystem>
#include <fstream>

using namespace optjit;
using optjit::test::check_error_contains;

namespace {

struct TempIr {
  std::filesystem::path path;
  // `name`: ctest runs the cases in parallel, so each writes a file of its own.
  TempIr(const std::string& name, const std::string& text) {
    path = test::temp_path(name + ".ir");
    std::ofstream(path) << text;
  }
  ~TempIr() { std::filesystem::remove(path); }
};

const std::string kScale = "graph @scale f32 {\n"
                           "  slot \"param\" : param tensor f32\n"
                           "  slot \"grad\" : grad tensor f32\n"
                           "  %0 = tensor \"param\" : el f32\n"
                           "  %1 = tensor \"grad\" : el f32\n"
                           "  %2 = hyper \"lr\" : pt f64\n"
                           "  %3 = cast %2 : pt f32\n"
                           "  %4 = mul %1, %3 : el f32\n"
                           "  %5 = sub %0, %4 : el f32\n"
                           "  store \"param\" %5\n"
                           "}\n";

} // namespace

TEST_CASE("ir files: every stage of a graph read from text, and a run that agrees with the interpreter") {
  TempIr file("stages", kScale);
  CHECK(dump_ir_file(file.path, Stage::Traced) == kScale);
  CHECK(dump_ir_file(file.path, Stage::Fused).find("fusion of @scale: 1 kernel(s) per step") != std::string::npos);
  CHECK(dump_ir_file(file.path, Stage::LLVM).find("define") != std::string::npos);
  CHECK(dump_ir_file(file.path, Stage::PTX, 90).find(".target sm_90") != std::string::npos);
  CHECK(run_ir_file({.file = file.path.string(), .params = "100,3x3", .set = "lr=0.5"}) == 0);
  check_error_contains([&] { run_ir_file({.file = file.path.string(), .set = ""}); },
                       "the graph reads hyperparameter 'lr': give it one value with --set lr=VALUE");
  // Refused before the tensors are made: these would take 8 TB.
  check_error_contains([&] { run_ir_file({.file = file.path.string(), .params = "1000000000000", .set = ""}); },
                       "the graph reads hyperparameter 'lr': give it one value with --set lr=VALUE");
  check_error_contains([&] { run_ir_file({.file = file.path.string(), .set = "lr=1,momentum=0.5"}); },
                       "--set momentum: the graph reads no hyperparameter of that name (it reads: lr)");
  check_error_contains([&] { run_ir_file({.file = file.path.string(), .set = "lr=1", .steps = 0}); },
                       "--steps is 0: run at least one step");
}

TEST_CASE("ir files: a missing file and a bad line are named") {
  check_error_contains([] { read_ir_file("/nonexistent/optjit.ir"); },
                       "cannot read the IR file /nonexistent/optjit.ir");
  TempIr bad("bad", "graph @g f32 {\n  %0 = frobnicate : pt f64\n}\n");
  check_error_contains([&] { read_ir_file(bad.path); }, bad.path.string() + ": ");
  check_error_contains([&] { read_ir_file(bad.path); }, "line 2");
}

TEST_CASE("ir files: rows and columns, infinities, carry stores and a graph that stores nothing run or are named") {
  // Row sums need the params' shapes (a 1-D param is one row), column sums params of rank 2 or more; an lr of inf gives
  // the same inf both ways, which agrees; a carry store nothing reads is harmless; a graph without stores has nothing
  // to run.
  TempIr rows("rows", "graph @rows f32 {\n"
                      "  slot \"param\" : param tensor f32\n"
                      "  slot \"grad\" : grad tensor f32\n"
                      "  %0 = tensor \"param\" : el f32\n"
                      "  %1 = tensor \"grad\" : el f32\n"
                      "  %2 = row_sum %1 : el f32\n"
                      "  %3 = sub %0, %2 : el f32\n"
                      "  store \"param\" %3\n"
                      "}\n");
  CHECK(run_ir_file({.file = rows.path.string(), .params = "4x3,2x5x2"}) == 0);
  CHECK(run_ir_file({.file = rows.path.string(), .params = "4,2x3"}) == 0); // a 1-D tensor is one row, both ways
  TempIr columns("columns", "graph @columns f32 {\n"
                            "  slot \"param\" : param tensor f32\n"
                            "  slot \"grad\" : grad tensor f32\n"
                            "  %0 = tensor \"param\" : el f32\n"
                            "  %1 = tensor \"grad\" : el f32\n"
                            "  %2 = col_sum %1 : el f32\n"
                            "  %3 = sub %0, %2 : el f32\n"
                            "  store \"param\" %3\n"
                            "}\n");
  CHECK(run_ir_file({.file = columns.path.string(), .params = "4x3"}) == 0);
  check_error_contains([&] { run_ir_file({.file = columns.path.string(), .params = "4"}); },
                       "of shape [4], which has no second-to-last dimension");
  TempIr scale("inf", kScale);
  CHECK(run_ir_file({.file = scale.path.string(), .params = "8", .set = "lr=inf", .steps = 1}) == 0);
  TempIr carry("carry", "graph @carry f32 {\n"
                        "  slot \"param\" : param tensor f32\n"
                        "  slot \"grad\" : grad tensor f32\n"
                        "  %0 = tensor \"param\" : el f32\n"
                        "  %1 = reduce_sum %0 : pt f64\n"
                        "  store_carry \"c0\" %1\n"
                        "  store \"param\" %0\n"
                        "}\n");
  CHECK(run_ir_file({.file = carry.path.string(), .params = "4"}) == 0);
  TempIr empty("empty", "graph @empty f32 {\n"
                        "  slot \"param\" : param tensor f32\n"
                        "  slot \"grad\" : grad tensor f32\n"
                        "}\n");
  check_error_contains([&] { run_ir_file({.file = empty.path.string(), .params = "4"}); },
                       "the graph stores nothing, so there is nothing to run");
  check_error_contains([&] { dump_ir_file(empty.path, Stage::LLVM); }, "the graph stores nothing");
  TempIr trailing("trailing", "graph @t f32 {\n"
                              "  slot \"param\" : param tensor f32\n"
                              "  slot \"grad\" : grad tensor f32\n"
                              "} junk\n");
  check_error_contains([&] { run_ir_file({.file = trailing.path.string()}); },
                       "parse error on line 4: text after the closing '}'");
  CHECK(dump_ir_file(scale.path, Stage::LLVM, 0, Device::cuda(0)).find("nvptx64-nvidia-cuda") != std::string::npos);
}
