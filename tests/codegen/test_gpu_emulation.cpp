// The GPU kernels, run on host threads (codegen.h's EmulatedGpuKernel: the same emitted kernel, its thread registers
// and barrier answered by the host, its blocks one after another), against the CPU kernels of the same plans. This
// checks the GPU kernels' logic without a GPU: work items and the 128-bit paths, block reductions, the last block
// of each tensor writing scalar state and carried values, list reductions between kernels. What only a GPU shows
// (its memory model, its math instructions, real concurrency between blocks) is test_cuda.cpp's.
#include "codegen/codegen.h"
#include "compiler/backend.h"
#include "compiler/backends/cuda/gpu_table.h"
#include "compiler/backends/matrix_products.h"
#include "compiler/compiled_step.h"
#include "compiler/pipeline.h"
#include "helpers.h"
#include "ir/parser.h"
#include "tools/count_configs.h"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <random>

using namespace optjit;

namespace {

// A plan's kernels emulated as the GPU backend runs them: a table per kernel in host memory, one carry buffer, an
// array per axis sum, the list reductions combined over the list between kernels. `axis_item_elements` >= 0
// replaces the GPU's cut of kernels over rows and columns (1: items of kMinAxisItemRows rows). Returns the column
// scratch the kernels used (doubles): > 0 when a matrix was cut into pieces.
// `hyper_addresses`: where the kernels read the hyperparameters their plans read on the device (Binding's).
int64_t run_emulated(const PipelineResult& pipeline, const ListArguments& given, unsigned threads,
                     EmulatedSchedule schedule = EmulatedSchedule::Concurrent, int64_t axis_item_elements = -1,
                     const std::vector<const void*>& hyper_addresses = {}) {
  int64_t col_scratch_used = 0;
  // Matrix products (Muon's) run between the kernels in the CPU's library, on scratch buffers in host memory, as
  // the GPU backend runs them in cuBLAS between its launches.
  MatrixProducts products(pipeline.scratch, host_matrix_library());
  std::vector<const KernelPlan*> plans;
  for (const KernelPlan& plan : pipeline.kernels)
    plans.push_back(&plan);
  const ListArguments& args = products.bind(given, plans);
  const std::size_t n = static_cast<std::size_t>(args.n_tensors());
  const KernelPlan& first = pipeline.kernels.front();
  const std::size_t n_carry = first.carries.size();
  std::vector<double> carry(std::max<std::size_t>(1, n * n_carry));
  std::vector<std::vector<double>> axis(n_carry);
  std::vector<double*> axis_table(std::max<std::size_t>(1, n_carry), nullptr);
  for (std::size_t k = 0; k < pipeline.kernels.size(); ++k) {
    const KernelPlan& plan = pipeline.kernels[k];
    const std::shared_ptr<EmulatedGpuKernel> kernel = compile_gpu_kernel_for_host(plan);
    Binding host;
    host.set_hyper_addresses(hyper_addresses); // the cells of numbers stay in the host table, which outlives the run
    LaunchShape shape = gpu_launch_shape(plan);
    if (axis_item_elements >= 0)
      shape.axis_item_elements = axis_item_elements;
    host.bind(plan, args, shape);
    for (std::size_t c = 0; c < n_carry; ++c) // NaN until a kernel writes them: a sum left out shows
      if (is_axis_carry(first.carry_kinds[c]) && axis[c].empty()) {
        const int64_t length = host.axis_length(first.carry_kinds[c]);
        axis[c].assign(static_cast<std::size_t>(length) + 1, std::numeric_limits<double>::quiet_NaN());
        axis_table[c] = axis[c].data();
      }
    GpuTable table = make_gpu_table(plan, host);
    col_scratch_used += table.col_scratch_doubles;
    // NaN: a column partial or pending store read before it is written shows.
    std::vector<double> col_scratch(static_cast<std::size_t>(table.col_scratch_doubles),
                                    std::numeric_limits<double>::quiet_NaN());
    kernel->launch(table.grid, threads,
                   table.at(reinterpret_cast<uint64_t>(table.image.data()), reinterpret_cast<uint64_t>(carry.data()),
                            reinterpret_cast<uint64_t>(axis_table.data()),
                            col_scratch.empty() ? 0 : reinterpret_cast<uint64_t>(col_scratch.data())),
                   schedule);
    products.run(k);
    std::vector<ListPartials> pending;
    const std::vector<std::size_t> columns = list_carry_columns(plan);
    for (std::size_t c : columns) {
      ListPartials& p = pending.emplace_back(ListPartials{plan.carry_kinds[c], std::vector<double>(n)});
      for (std::size_t t = 0; t < n; ++t)
        p.values[t] = carry[t * n_carry + c];
    }
    combine_each_over_list(pending);
    for (std::size_t i = 0; i < columns.size(); ++i)
      for (std::size_t t = 0; t < n; ++t)
        carry[t * n_carry + columns[i]] = pending[i].values[t];
  }
  return col_scratch_used;
}

// The same plan's CPU kernels on `args`: the reference the emulated GPU kernels are checked against.
void run_on_cpu(const PipelineResult& pipeline, const ListArguments& args) {
  bool hit = false;
  std::unique_ptr<Executable> code =
      cpu_backend().load(pipeline, Target::for_device(Device::cpu(), Execution::Compiled), CompileOptions{}, hit);
  code->bind(args);
  code->launch();
}

// Lists of `shapes` random params and their grads in one group, with hyperparameter lr and the params' shapes.
ListArguments param_and_grad_lists(const std::vector<Shape>& shapes, uint64_t seed, double lr) {
  ListArguments args;
  args.slot_names = {"param", "grad"};
  args.hyper_names = {"lr"};
  args.hyper = {lr};
  const std::vector<Tensor> params = random_params(shapes, Dtype::f32, seed);
  args.slot_tensors = {params, {}};
  for (const Tensor& p : params) {
    args.slot_tensors[1].push_back(p.grad());
    args.group_of.push_back(0);
    args.shapes.push_back(p.shape());
  }
  return args;
}

// The shapes most checks step: chunks and tails, an empty and a 0-d param, and matrices for rows and columns (more
// rows than a block has warps, a batch of matrices, a single row, a single column).
const std::vector<Shape> kShapes = {{33, 7}, {5}, {9000}, {0}, {4, 4}, {}, {70, 45}, {3, 5, 40}, {1, 70}, {50, 1}};

// One step of `opt` with its GPU kernels emulated (run_emulated, bucket by bucket); returns their column scratch.
int64_t step_emulated(Optimizer& opt, unsigned threads, EmulatedSchedule schedule = EmulatedSchedule::Concurrent,
                      int64_t axis_item_elements = -1) {
  opt.ensure_state();
  int64_t col_scratch_used = 0;
  for (auto& [bucket, graph] : opt.describe().buckets)
    col_scratch_used +=
        run_emulated(run_pipeline(std::move(graph)), opt.list_arguments(bucket), threads, schedule, axis_item_elements);
  return col_scratch_used;
}

// `steps` steps of config `c` on two copies of the params: the GPU kernels emulated on one, the CPU kernels on the
// other. Returns run_emulated's column scratch, summed over the steps.
int64_t check_emulated_against_cpu(const CountConfig& c, Dtype dtype, unsigned threads, int steps,
                                   const std::vector<Shape>& shapes = kShapes,
                                   EmulatedSchedule schedule = EmulatedSchedule::Concurrent,
                                   int64_t axis_item_elements = -1) {
  int64_t col_scratch_used = 0;
  const std::vector<Tensor> initial = random_params(shapes, dtype, 13);
  std::vector<Tensor> emulated = copy_params(initial), reference = copy_params(initial);
  auto opt_emulated = test::make_single_group(c.optimizer, emulated, c.options, true);
  auto opt_reference = test::make_single_group(c.optimizer, reference, c.options, true);
  const Target cpu = Target::for_device(Device::cpu(), Execution::Compiled);
  for (int s = 0; s < steps; ++s) {
    randomize_grads(emulated, 500 + static_cast<uint64_t>(s));
    randomize_grads(reference, 500 + static_cast<uint64_t>(s));
    col_scratch_used += step_emulated(*opt_emulated, threads, schedule, axis_item_elements);
    opt_reference->ensure_state();
    for (auto& [bucket, graph] : opt_reference->describe().buckets) {
      bool hit = false;
      std::unique_ptr<Executable> code = cpu_backend().load(run_pipeline(std::move(graph)), cpu, CompileOptions{}, hit);
      code->bind(opt_reference->list_arguments(bucket));
      code->launch();
    }
  }
  // The emulated kernels are the GPU's LLVM IR compiled for this CPU: the same arithmetic as the CPU kernels up to
  // contraction into fused multiply-adds and the device exp, log and pow, so a few ulp apart at most.
  const double eps = dtype == Dtype::bf16 ? 0x1p-7 : dtype == Dtype::f16 ? 0x1p-10 : 0;
  const double rtol = dtype == Dtype::f32 ? 1e-5 : dtype == Dtype::f64 ? 1e-12 : 4 * eps;
  const double atol = dtype == Dtype::f32 ? 1e-6 : dtype == Dtype::f64 ? 1e-14 : 2 * eps;
  test::check_same_trajectory(emulated, *opt_emulated, reference, *opt_reference, rtol, atol, "emulated GPU vs CPU");
  return col_scratch_used;
}

} // namespace

TEST_CASE("gpu emulation: every optimizer configuration's GPU kernels step as its CPU kernels") {
  std::vector<CountConfig> configs = torch_optim_configs();
  for (const CountConfig& c : own_optimizer_configs())
    configs.push_back(c);
  int checked = 0;
  for (Dtype dtype : {Dtype::f32, Dtype::bf16})
    for (const CountConfig& c : configs) {
      INFO(c.optimizer << " " << config_name(c.options) << " " << dtype_name(dtype));
      check_emulated_against_cpu(c, dtype, 64, 3);
      ++checked;
    }
  CHECK(checked >= 100);
}

TEST_CASE("gpu emulation: Muon's GPU kernels, between the library's products, step as its CPU kernels") {
  // Tall, wide and square matrices, two of one shape (one batched product), a single row; every option set.
  const std::vector<Shape> shapes = {{24, 40}, {40, 24}, {24, 40}, {16, 16}, {1, 30}};
  std::vector<CountConfig> configs = matrix_configs();
  configs.push_back({"muon", {{"f32_iterations", {1}}, {"weight_decay", {0.1}}}, 0, true});
  int checked = 0;
  for (Dtype dtype : {Dtype::f32, Dtype::bf16})
    for (const CountConfig& c : configs) {
      INFO(c.optimizer << " " << config_name(c.options) << " " << dtype_name(dtype));
      check_emulated_against_cpu(c, dtype, 64, 3, shapes);
      ++checked;
    }
  CHECK(checked >= 8);
}

TEST_CASE("gpu emulation: reductions (LAMB's and LARS's norms) and f64, f16, blocks of 32 and 512 threads") {
  for (const CountConfig& c : reducing_configs()) {
    if (c.clip_norm_type != 0)
      continue; // clipping's norm is the driver's own pass
    for (Dtype dtype : {Dtype::f32, Dtype::f64}) {
      INFO(c.optimizer << " " << config_name(c.options) << " " << dtype_name(dtype));
      check_emulated_against_cpu(c, dtype, 96, 3);
    }
  }
  for (unsigned threads : {32u, 512u}) {
    INFO(threads << " threads");
    check_emulated_against_cpu({"adam", {{"amsgrad", {1}}}}, Dtype::f16, threads, 2);
    check_emulated_against_cpu({"lamb", {}}, Dtype::f64, threads, 2);
    check_emulated_against_cpu({"adafactor", {}}, Dtype::f64, threads, 2);
  }
  // In turns (a missing barrier shows every time): a block reduction's tree, the last block's combine.
  check_emulated_against_cpu({"lamb", {{"weight_decay", {0.1}}}}, Dtype::f32, 64, 2, {{33, 7}, {9000}, {0}, {}},
                             EmulatedSchedule::InTurns);
}

TEST_CASE("gpu emulation: Adafactor's rows and columns in every dtype and block size") {
  // Many rounds of rows per block, a batch of matrices, a single row, a single column, rows shorter than a warp.
  const std::vector<Shape> shapes = {{300, 130}, {2, 3, 40, 33}, {1, 300}, {200, 1}, {90, 5}, {7}};
  // In turns, a missing barrier shows every time; concurrently, real threads meet at the barriers.
  const std::tuple<unsigned, Dtype, EmulatedSchedule> runs[] = {{32, Dtype::f32, EmulatedSchedule::InTurns},
                                                                {96, Dtype::bf16, EmulatedSchedule::InTurns},
                                                                {96, Dtype::f16, EmulatedSchedule::Concurrent},
                                                                {512, Dtype::f32, EmulatedSchedule::Concurrent}};
  for (const auto& [threads, dtype, schedule] : runs) {
    INFO(threads << " threads, " << dtype_name(dtype)
                 << std::string(schedule == EmulatedSchedule::InTurns ? ", in turns" : ""));
    check_emulated_against_cpu({"adafactor", {}}, dtype, threads, 2, shapes, schedule);
    check_emulated_against_cpu({"adafactor", {{"beta2_decay", {-0.5}}, {"eps", {0.0, 1e-2}}, {"maximize", {1}}}}, dtype,
                               threads, 2, shapes, schedule);
  }
}

TEST_CASE("gpu emulation: Adafactor's matrices cut into pieces of rows, column sums combined by the last piece") {
  // Items of kMinAxisItemRows rows: 10 pieces of 300 rows, 2 pieces of each of 6 batched 40-row matrices, 7 pieces
  // of a column, 3 of rows shorter than a warp; whole matrices grouped beside them ({3, 5, 40}, a row, a vector).
  // Rows of a multiple of 4 (and 2) columns take 128-bit accesses: {64, 256} and {96, 12} in pieces, {3, 5, 40} whole.
  const std::vector<Shape> shapes = {{300, 130}, {2, 3, 40, 33}, {200, 1}, {90, 5}, {3, 5, 40}, {1, 300}, {7},
                                     {0},        {64, 256},      {96, 12}};
  const std::tuple<unsigned, Dtype, EmulatedSchedule> runs[] = {{32, Dtype::f32, EmulatedSchedule::InTurns},
                                                                {96, Dtype::bf16, EmulatedSchedule::InTurns},
                                                                {512, Dtype::f64, EmulatedSchedule::Concurrent}};
  for (const auto& [threads, dtype, schedule] : runs) {
    INFO(threads << " threads, " << dtype_name(dtype)
                 << std::string(schedule == EmulatedSchedule::InTurns ? ", in turns" : ""));
    CHECK(check_emulated_against_cpu({"adafactor", {}}, dtype, threads, 2, shapes, schedule, 1) > 0);
    CHECK(check_emulated_against_cpu({"adafactor", {{"beta2_decay", {-0.5}}, {"eps", {0.0, 1e-2}}, {"maximize", {1}}}},
                                     dtype, threads, 2, shapes, schedule, 1) > 0);
  }
  // The GPU's own cut (two chunks of rows) cuts a Transformer-sized matrix, not a small one.
  CHECK(check_emulated_against_cpu({"adafactor", {}}, Dtype::f32, 512, 1, {{1536, 512}}) > 0);
  CHECK(check_emulated_against_cpu({"adafactor", {}}, Dtype::f32, 512, 1, {{64, 512}}) == 0);
}

namespace {

// Params (and grads) with the values of `like` in `memory`, one element past a 16-byte boundary: no 128-bit access.
std::vector<Tensor> misaligned_copies(const std::vector<Tensor>& like, std::vector<std::vector<double>>& memory) {
  std::vector<Tensor> params;
  const auto copy = [&](const Tensor& t) {
    const std::vector<double> values = t.to_vector();
    std::vector<double>& block = memory.emplace_back(values.size() + 2, 0.0);
    std::copy(values.begin(), values.end(), block.begin() + 1);
    return Tensor::from_blob(block.data() + 1, t.shape(), Dtype::f64);
  };
  for (const Tensor& p : like) {
    params.push_back(copy(p));
    params.back().set_grad(copy(p.grad()));
  }
  return params;
}

// `steps` emulated GPU steps of config `c` on `params` (their grads fixed).
void steps_emulated(const CountConfig& c, const std::vector<Tensor>& params, int steps) {
  auto opt = test::make_single_group(c.optimizer, params, c.options, true);
  for (int s = 0; s < steps; ++s)
    step_emulated(*opt, 64);
}

} // namespace

TEST_CASE("gpu emulation: sums do not depend on where the params lie, only on their shapes") {
  // Misaligned params take scalar accesses, aligned ones 128-bit ones; the lanes and the order of every sum (row sums,
  // per-tensor norms) stay the same, so the results are bitwise equal. f64, where a sum's last bit shows.
  const std::vector<Shape> shapes = {{64, 256}, {40, 12}, {33, 7}, {9000}};
  for (const CountConfig& c : {CountConfig{"adafactor", {}}, CountConfig{"lamb", {}}}) {
    INFO(c.optimizer);
    const std::vector<Tensor> aligned = random_params(shapes, Dtype::f64, 5);
    randomize_grads(aligned, 6);
    std::vector<std::vector<double>> memory;
    const std::vector<Tensor> misaligned = misaligned_copies(aligned, memory);
    REQUIRE(reinterpret_cast<uintptr_t>(misaligned.front().data()) % 16 != 0);
    REQUIRE(reinterpret_cast<uintptr_t>(aligned.front().data()) % 16 == 0);
    steps_emulated(c, aligned, 2);
    steps_emulated(c, misaligned, 2);
    for (std::size_t i = 0; i < shapes.size(); ++i)
      CHECK(aligned[i].to_vector() == misaligned[i].to_vector());
  }
}

TEST_CASE("gpu emulation: nine reductions in one kernel take several passes of the block's tree") {
  // More reductions than one pass of shared memory holds (kBlockReductionsAtOnce), sums and maxes mixed.
  const PipelineResult pipeline = run_pipeline(parse_graph(R"(graph @nine f32 {
  slot "param" : param tensor f32
  slot "grad" : grad tensor f32
  %0 = hyper "lr" : pt f64
  %1 = tensor "param" : el f32
  %2 = tensor "grad" : el f32
  %3 = mul %2, %2 : el f32
  %4 = reduce_sum %3 : pt f64
  %5 = abs %2 : el f32
  %6 = reduce_max %5 : pt f64
  %7 = reduce_sum %2 : pt f64
  %8 = mul %1, %1 : el f32
  %9 = reduce_sum %8 : pt f64
  %10 = abs %1 : el f32
  %11 = reduce_max %10 : pt f64
  %12 = reduce_sum %1 : pt f64
  %13 = mul %1, %2 : el f32
  %14 = reduce_sum %13 : pt f64
  %15 = reduce_max %2 : pt f64
  %16 = reduce_max %1 : pt f64
  %17 = add %4, %6 : pt f64
  %18 = mul %17, %7 : pt f64
  %19 = sub %18, %9 : pt f64
  %20 = div %19, %11 : pt f64
  %21 = add %20, %12 : pt f64
  %22 = mul %21, %14 : pt f64
  %23 = sub %22, %15 : pt f64
  %24 = add %23, %16 : pt f64
  %25 = mul %0, %24 : pt f64
  %26 = cast %25 : pt f32
  %27 = mul %2, %26 : el f32
  %28 = sub %1, %27 : el f32
  store "param" %28
}
)"));
  REQUIRE(pipeline.kernels.size() == 2);
  const auto lists = [] { return param_and_grad_lists({{20000}, {7}, {3, 3}}, 5, 1e-3); };
  for (unsigned threads : {32u, 512u}) {
    const ListArguments emulated = lists(), reference = lists();
    run_emulated(pipeline, emulated, threads, EmulatedSchedule::InTurns);
    run_on_cpu(pipeline, reference);
    for (std::size_t t = 0; t < 3; ++t) {
      INFO(threads << " threads, tensor " << t);
      CHECK(test::scaled_error(emulated.slot_tensors[0][t], reference.slot_tensors[0][t], 1e-5, 1e-6) <= 1.0);
      CHECK(test::scaled_error(emulated.slot_tensors[0][t], lists().slot_tensors[0][t], 0, 1e-12) > 1.0); // stepped
    }
  }
}

TEST_CASE("gpu emulation: four row sums in one kernel run, a fifth is refused by name (shared memory)") {
  // param -= lr * (sum of the row sums of g^2, g, p, p g and |g|, the first `count` of them)
  const auto graph = [](int count) {
    std::string text = R"(graph @rows f32 {
  slot "param" : param tensor f32
  slot "grad" : grad tensor f32
  %0 = hyper "lr" : pt f64
  %1 = cast %0 : pt f32
  %2 = tensor "param" : el f32
  %3 = tensor "grad" : el f32
  %4 = mul %3, %3 : el f32
  %5 = mul %2, %3 : el f32
  %6 = abs %3 : el f32
)";
    const char* operands[] = {"%4", "%3", "%2", "%5", "%6"};
    const auto line = [&](int id, const std::string& rest) {
      text += "  %" + std::to_string(id) + " = " + rest + "\n";
    };
    for (int k = 0; k < count; ++k)
      line(7 + k, std::string("row_sum ") + operands[k] + " : el f32");
    int last = 7;
    for (int k = 1; k < count; ++k) {
      line(6 + count + k, "add %" + std::to_string(last) + ", %" + std::to_string(7 + k) + " : el f32");
      last = 6 + count + k;
    }
    const int scaled = 6 + 2 * count;
    line(scaled, "mul %" + std::to_string(last) + ", %1 : el f32");
    line(scaled + 1, "sub %2, %" + std::to_string(scaled) + " : el f32");
    text += "  store \"param\" %" + std::to_string(scaled + 1) + "\n}\n";
    return run_pipeline(parse_graph(text));
  };
  const PipelineResult four = graph(4);
  REQUIRE(four.kernels.size() == 2);
  const ListArguments emulated = param_and_grad_lists({{40, 70}, {3, 2, 5}}, 9, 1e-3);
  const ListArguments reference = param_and_grad_lists({{40, 70}, {3, 2, 5}}, 9, 1e-3);
  run_emulated(four, emulated, 64, EmulatedSchedule::InTurns);
  run_on_cpu(four, reference);
  for (std::size_t t = 0; t < 2; ++t)
    CHECK(test::scaled_error(emulated.slot_tensors[0][t], reference.slot_tensors[0][t], 1e-5, 1e-6) <= 1.0);
  const PipelineResult five = graph(5);
  test::check_error_contains([&] { compile_gpu_kernel_for_host(five.kernels.front()); },
                             "sums 5 values along rows in one pass");
}

TEST_CASE("gpu emulation: column, row and tensor sums in the kernel that stores tensor, rows and columns slots") {
  // Kernel k0 sums p g + r + c along rows, columns and the whole tensor, and stores param, r and c, which its sums
  // read: its column sweep must read them all before its row sweep writes any.
  const PipelineResult pipeline = run_pipeline(parse_graph(R"(graph @mixed f32 {
  slot "param" : param tensor f32
  slot "grad" : grad tensor f32
  slot "r" : state rows f32
  slot "c" : state cols f32
  slot "out" : state tensor f32
  %0 = hyper "lr" : pt f64
  %1 = cast %0 : pt f32
  %2 = tensor "param" : el f32
  %3 = tensor "grad" : el f32
  %4 = tensor "r" : el f32
  %5 = tensor "c" : el f32
  %6 = mul %3, %2 : el f32
  %7 = add %6, %4 : el f32
  %8 = add %7, %5 : el f32
  %9 = row_sum %8 : el f32
  %10 = col_sum %8 : el f32
  %11 = reduce_sum %8 : pt f64
  %12 = add %4, %5 : el f32
  %13 = mul %3, %12 : el f32
  %14 = mul %13, %1 : el f32
  %15 = sub %2, %14 : el f32
  %16 = constant 0.5 : pt f64
  %17 = cast %16 : pt f32
  %18 = mul %4, %17 : el f32
  %19 = add %18, %3 : el f32
  %20 = mul %5, %17 : el f32
  %21 = add %20, %3 : el f32
  %22 = add %9, %10 : el f32
  %23 = cast %11 : pt f32
  %24 = add %22, %23 : el f32
  store "param" %15
  store "r" %19
  store "c" %21
  store "out" %24
}
)"));
  REQUIRE(pipeline.kernels.size() == 2);
  const std::vector<Shape> shapes = {{40, 70}, {3, 5, 33}, {1, 9}, {9, 1}, {4, 40}};
  const auto lists = [&] {
    ListArguments args = param_and_grad_lists(shapes, 21, 0.1);
    args.slot_names.insert(args.slot_names.end(), {"r", "c", "out"});
    args.slot_tensors.resize(5);
    for (const Tensor& p : args.slot_tensors[0]) {
      Shape rows = p.shape(), cols = p.shape();
      rows.back() = 1;
      cols[cols.size() - 2] = 1;
      const auto ramp = [](const Shape& shape, double scale) {
        std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
        for (std::size_t i = 0; i < v.size(); ++i)
          v[i] = scale * std::sin(0.3 * static_cast<double>(i) + 1);
        return Tensor::from_values(shape, v, Dtype::f32);
      };
      args.slot_tensors[2].push_back(ramp(rows, 0.5));
      args.slot_tensors[3].push_back(ramp(cols, 0.25));
      args.slot_tensors[4].push_back(Tensor::zeros(p.shape(), Dtype::f32));
    }
    return args;
  };
  for (unsigned threads : {32u, 160u}) {
    const ListArguments emulated = lists(), reference = lists();
    run_emulated(pipeline, emulated, threads, EmulatedSchedule::InTurns);
    run_on_cpu(pipeline, reference);
    for (std::size_t s : {0, 2, 3, 4})
      for (std::size_t t = 0; t < shapes.size(); ++t) {
        INFO(threads << " threads, slot " << reference.slot_names[s] << ", tensor " << t);
        CHECK(test::scaled_error(emulated.slot_tensors[s][t], reference.slot_tensors[s][t], 1e-5, 1e-6) <= 1.0);
      }
  }
}

TEST_CASE("gpu emulation: a list reduction (clipping by the global norm) combines between the GPU kernels") {
  // SGD clipped by the global 2-norm of the grads; the largest |g| over the list is kept as scalar state.
  const PipelineResult pipeline = run_pipeline(parse_graph(R"(graph @clipped f32 {
  slot "param" : param tensor f32
  slot "grad" : grad tensor f32
  slot "peak" : state scalar f32
  %0 = hyper "lr" : pt f64
  %1 = tensor "param" : el f32
  %2 = tensor "grad" : el f32
  %3 = mul %2, %2 : el f32
  %4 = reduce_sum %3 : pt f64
  %5 = list_sum %4 : pt f64
  %6 = sqrt %5 : pt f64
  %7 = div %0, %6 : pt f64
  %8 = cast %7 : pt f32
  %9 = mul %2, %8 : el f32
  %10 = sub %1, %9 : el f32
  %11 = abs %2 : el f32
  %12 = reduce_max %11 : pt f64
  %13 = list_max %12 : pt f64
  store "param" %10
  store_scalar "peak" %13
}
)"));
  REQUIRE(pipeline.kernels.size() == 2);
  const auto lists = [] {
    ListArguments args = param_and_grad_lists({{9000}, {7}, {0}, {3, 3}}, 77, 0.5);
    args.slot_names.push_back("peak");
    args.slot_tensors.emplace_back();
    for (std::size_t t = 0; t < 4; ++t)
      args.slot_tensors[2].push_back(Tensor::zeros({}, Dtype::f32));
    return args;
  };
  const ListArguments emulated = lists(), reference = lists();
  run_emulated(pipeline, emulated, 64);
  run_on_cpu(pipeline, reference);
  for (std::size_t s = 0; s < 3; s += 2)
    for (std::size_t t = 0; t < 4; ++t) {
      INFO("slot " << emulated.slot_names[s] << ", tensor " << t);
      CHECK(test::scaled_error(emulated.slot_tensors[s][t], reference.slot_tensors[s][t], 1e-6, 1e-7) <= 1.0);
    }
  CHECK(reference.slot_tensors[2][0].item() > 0); // the peak was written
}

TEST_CASE("gpu emulation: hyperparameters read on the device (a tensor's value, a number in a cell) step as numbers") {
  // Two groups. lr of group 0 is an f32 tensor's value (its address in the table; the value entry is NaN, which a
  // kernel reading it as a number would spread); lr of group 1 and decay of both are numbers the binding puts in
  // cells after the table, in the dtype the kernel reads (f32 and f64).
  PipelineResult pipeline = run_pipeline(parse_graph(R"(graph @on_device f32 {
  slot "param" : param tensor f32
  slot "grad" : grad tensor f32
  %0 = hyper "lr" : pt f64
  %1 = hyper "decay" : pt f64
  %2 = tensor "param" : el f32
  %3 = tensor "grad" : el f32
  %4 = cast %0 : pt f32
  %5 = cast %1 : pt f32
  %6 = mul %3, %4 : el f32
  %7 = mul %2, %5 : el f32
  %8 = add %6, %7 : el f32
  %9 = sub %2, %8 : el f32
  store "param" %9
}
)"));
  REQUIRE(pipeline.kernels.size() == 1);
  KernelPlan& plan = pipeline.kernels.front();
  plan.hypers_on_device = {{"lr", Dtype::f32}, {"decay", Dtype::f64}};
  CHECK(print_kernel_plan(plan).find("hypers: lr (f32 on device), decay (f64 on device)") != std::string::npos);
  CHECK(parse_kernel_plan(print_kernel_plan(plan)) == plan);

  const auto lists = [] {
    ListArguments args = param_and_grad_lists({{9000}, {7}, {0}, {3, 3}}, 78, 0.5);
    args.hyper_names = {"lr", "decay"};
    args.hyper = {0.5, 0.25, 0.125, 0.0625}; // groups x names: each exact in f32
    args.group_of = {0, 1, 1, 0};
    return args;
  };
  ListArguments emulated = lists();
  const ListArguments reference = lists();
  const float lr_tensor = 0.5f; // group 0's lr, "on the device"
  emulated.hyper[0] = std::numeric_limits<double>::quiet_NaN();
  const std::vector<const void*> addresses = {&lr_tensor, nullptr, nullptr, nullptr};
  run_emulated(pipeline, emulated, 64, EmulatedSchedule::Concurrent, -1, addresses);
  PipelineResult numbers = pipeline;
  numbers.kernels.front().hypers_on_device.clear();
  run_on_cpu(numbers, reference);
  for (std::size_t t = 0; t < 4; ++t) {
    INFO("tensor " << t);
    CHECK(test::scaled_error(emulated.slot_tensors[0][t], reference.slot_tensors[0][t], 1e-6, 1e-7) <= 1.0);
  }
}

namespace {

// Every byte of the params and their state, in order (codes and scales included).
std::vector<std::vector<uint8_t>> state_bytes(const std::vector<Tensor>& params, const Optimizer& opt) {
  std::vector<std::vector<uint8_t>> all;
  const auto add = [&](const Tensor& t) {
    const Tensor dense = t.clone();
    const auto* bytes = static_cast<const uint8_t*>(dense.data());
    all.emplace_back(bytes, bytes + dense.nbytes());
  };
  for (const Tensor& p : params) {
    add(p);
    for (const auto& [key, t] : *opt.state(p))
      add(t);
  }
  return all;
}

} // namespace

TEST_CASE("gpu emulation: the grad total kernels combine every bucket's contributions as GradNormTotal does, and "
          "write found_inf for a check value that is not 0") {
  // Buckets' carry buffers (f64 grads, bf16, f16, f32), 3 values per tensor: another carry's (never read), the norm's
  // contribution, the check value (0, or NaN for an inf or NaN); counts below, at and above the block's threads.
  struct Bucket {
    std::vector<double> carry;
    int64_t n;
    Dtype dtype;
    GpuGradRounding rounding;
  };
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<double> uniform(0.0, 3.0);
  const auto make = [&](int64_t n, Dtype dtype, GpuGradRounding rounding) {
    Bucket bucket{std::vector<double>(static_cast<std::size_t>(3 * n)), n, dtype, rounding};
    for (int64_t t = 0; t < n; ++t) {
      bucket.carry[static_cast<std::size_t>(3 * t)] = -1;
      bucket.carry[static_cast<std::size_t>(3 * t + 1)] = uniform(rng) * uniform(rng);
      bucket.carry[static_cast<std::size_t>(3 * t + 2)] = 0;
    }
    return bucket;
  };
  using Norm = GpuGradTotalForm::Norm;
  for (GpuGradTotalForm form : {GpuGradTotalForm{Norm::l2, false}, GpuGradTotalForm{Norm::infinity, false},
                                GpuGradTotalForm{Norm::l2, true}, GpuGradTotalForm{Norm::none, true}}) {
    const bool l2 = form.norm == Norm::l2;
    const std::shared_ptr<EmulatedGpuKernel> kernel = compile_gpu_grad_total_for_host(form);
    for (const std::vector<int64_t>& counts : std::vector<std::vector<int64_t>>{{0}, {1, 3}, {256, 1, 700, 255}}) {
      INFO("norm " << static_cast<int>(form.norm) << (form.checks ? ", checked, " : ", ") << counts.size()
                   << " buckets");
      const Dtype dtypes[] = {Dtype::f64, Dtype::bf16, Dtype::f16, Dtype::f32};
      const GpuGradRounding roundings[] = {GpuGradRounding::none, GpuGradRounding::bf16, GpuGradRounding::f16,
                                           GpuGradRounding::f32};
      std::vector<Bucket> buckets;
      for (std::size_t k = 0; k < counts.size(); ++k)
        buckets.push_back(make(counts[k], dtypes[k % 4], roundings[k % 4]));
      for (bool with_nan : {false, true}) {
        if (with_nan && counts.back() > 0) { // an inf among the last tensor's grads: its norm and check are NaN
          buckets.back().carry[buckets.back().carry.size() - 2] = std::nan("");
          buckets.back().carry.back() = std::nan("");
        }
        double total = -1, coefficient = -1, copy = -1;
        float found_inf = 0;
        std::vector<uint64_t> words = {counts.size(),
                                       reinterpret_cast<uintptr_t>(&total),
                                       reinterpret_cast<uintptr_t>(&coefficient),
                                       std::bit_cast<uint64_t>(0.75),
                                       with_nan ? reinterpret_cast<uintptr_t>(&copy) : 0,
                                       reinterpret_cast<uintptr_t>(&found_inf)};
        GradNormTotal expected(l2 ? 2.0 : std::numeric_limits<double>::infinity());
        bool any_nonfinite = false;
        for (const Bucket& bucket : buckets) {
          for (uint64_t w : {static_cast<uint64_t>(reinterpret_cast<uintptr_t>(bucket.carry.data())),
                             static_cast<uint64_t>(bucket.n), uint64_t{3}, uint64_t{1},
                             static_cast<uint64_t>(bucket.rounding), uint64_t{2}})
            words.push_back(w);
          for (int64_t t = 0; t < bucket.n; ++t) {
            expected.add(bucket.carry[static_cast<std::size_t>(3 * t + 1)], bucket.dtype);
            any_nonfinite = any_nonfinite || bucket.carry[static_cast<std::size_t>(3 * t + 2)] != 0;
          }
        }
        double totals[2];
        for (EmulatedSchedule schedule : {EmulatedSchedule::Concurrent, EmulatedSchedule::InTurns}) {
          kernel->launch_with(1, kGpuGradTotalThreads, words.data(), schedule);
          totals[schedule == EmulatedSchedule::InTurns] = total;
        }
        CHECK(found_inf == (form.checks && any_nonfinite ? 1.0f : 0.0f));
        if (form.norm == Norm::none) {
          CHECK(total == -1); // no norm: nothing else written
          CHECK(coefficient == -1);
          continue;
        }
        CHECK(std::bit_cast<uint64_t>(totals[0]) == std::bit_cast<uint64_t>(totals[1]));          // a fixed order
        CHECK(std::bit_cast<uint64_t>(copy) == std::bit_cast<uint64_t>(with_nan ? total : -1.0)); // written when asked
        const double want = expected.total();
        if (std::isnan(want)) {
          CHECK(std::isnan(total));
          CHECK(std::isnan(coefficient));
          continue;
        }
        // The 2-norm sums in another order than the host's (threads, then a tree): equal to rounding. The largest
        // value is exact.
        if (l2)
          CHECK(total == doctest::Approx(want).epsilon(1e-14));
        else
          CHECK(total == want);
        const double want_coefficient = std::min(0.75 / (want + 1e-6), 1.0);
        CHECK(coefficient == doctest::Approx(want_coefficient).epsilon(1e-14));
      }
    }
  }
}

TEST_CASE("gpu emulation: block-quantized state steps as on the CPU, every code and scale, with any thread count") {
  // torchao's low-bit AdamW (its f32 powf in the prologue: the device's pow) and state_dtype over Adam and SGD; a
  // matrix in one work item, a small param (plain state), matrices of several items in blocks of 256, 128 or 36.
  const std::vector<std::pair<std::string, KeywordOptions>> configs = {
      {"AdamW8bit", {{"lr", {0.01}}}},
      {"AdamW4bit", {{"lr", {0.01}}, {"amsgrad", {1}}}},
      {"AdamWFp8", {{"lr", {0.01}}}},
      {"AdamW8bit", {{"lr", {0.01}}, {"block_size", {36}}}},
      {"adam", {{"lr", {0.01}}, {"state_dtype", {named_option_value("state_dtype", "int8")}}}},
      {"sgd", {{"lr", {0.1}}, {"momentum", {0.9}}, {"state_dtype", {named_option_value("state_dtype", "int4")}}}},
      {"rmsprop", {{"lr", {0.01}}, {"momentum", {0.5}}, {"state_dtype", {named_option_value("state_dtype", "fp8")}}}}};
  for (const auto& [name, options] : configs)
    for (const auto& [threads, schedule] : std::vector<std::pair<unsigned, EmulatedSchedule>>{
             {64, EmulatedSchedule::Concurrent}, {32, EmulatedSchedule::InTurns}}) {
      INFO(name << " " << config_name(options) << " " << threads << " threads");
      const std::vector<Tensor> initial = random_params({{64, 72}, {1000}, {96, 512}, {300, 144}}, Dtype::f32, 21);
      std::vector<Tensor> emulated = copy_params(initial), reference = copy_params(initial);
      auto opt_emulated = test::make_single_group(name, emulated, options, true);
      auto opt_reference = test::make_single_group(name, reference, options, true);
      CompiledStep cpu = compile(*opt_reference);
      for (int s = 0; s < 3; ++s) {
        randomize_grads(emulated, 700 + static_cast<uint64_t>(s));
        randomize_grads(reference, 700 + static_cast<uint64_t>(s));
        step_emulated(*opt_emulated, threads, schedule);
        cpu();
        CHECK(state_bytes(emulated, *opt_emulated) == state_bytes(reference, *opt_reference));
      }
      bool quantized = false;
      for (const auto& [key, t] : *opt_emulated->state(emulated[0]))
        quantized = quantized || is_code_dtype(t.dtype());
      CHECK(quantized);
    }
}

TEST_CASE("gpu emulation: a kernel that quantizes its stores and reduces (LAMB's norms) steps as on the CPU") {
  // LAMB's first kernel stores the quantized moments and sums the norms of the param and the update, a thread's
  // blocks at a time: its codes equal the CPU's; the params, through the norms' order, within a few ulp.
  for (const char* dtype : {"int8", "int4"}) {
    INFO(dtype);
    const KeywordOptions options = {
        {"lr", {0.01}}, {"weight_decay", {0.1}}, {"state_dtype", {named_option_value("state_dtype", dtype)}}};
    const std::vector<Tensor> initial = random_params({{64, 72}, {96, 512}}, Dtype::f32, 23);
    std::vector<Tensor> emulated = copy_params(initial), reference = copy_params(initial);
    auto opt_emulated = test::make_single_group("lamb", emulated, options, true);
    auto opt_reference = test::make_single_group("lamb", reference, options, true);
    CompiledStep cpu = compile(*opt_reference);
    randomize_grads(emulated, 900);
    randomize_grads(reference, 900);
    step_emulated(*opt_emulated, 64);
    cpu();
    for (std::size_t k = 0; k < emulated.size(); ++k) {
      CHECK(test::scaled_error(emulated[k], reference[k], 1e-5, 1e-7) <= 1.0);
      for (const char* key : {"exp_avg", "exp_avg_sq"}) {
        CAPTURE(key);
        const Tensor codes = find_state(*opt_emulated->state(emulated[k]), key);
        REQUIRE(is_code_dtype(codes.dtype()));
        const auto* a = static_cast<const uint8_t*>(codes.data());
        const auto* b = static_cast<const uint8_t*>(find_state(*opt_reference->state(reference[k]), key).data());
        CHECK(std::equal(a, a + codes.nbytes(), b));
      }
    }
  }
}
