// The runtime: tensors, the host allocator, the thread pool, work items, dtype/device parsing and the CUDA driver
// loader.
#include "helpers.h"
#include "runtime/allocator.h"
#include "runtime/cuda/cuda_driver.h"
#include "runtime/tensor.h"
#include "runtime/thread_pool.h"
#include "runtime/work_items.h"

#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>

using namespace optjit;
using optjit::test::check_error;
using optjit::test::check_error_contains;

TEST_CASE("tensor: shapes, 0-d and zero-size tensors, values round to the dtype") {
  Tensor scalar = Tensor::full({}, 0.1, Dtype::f32);
  CHECK(scalar.dim() == 0);
  CHECK(scalar.numel() == 1);
  CHECK(scalar.item() == static_cast<double>(0.1f));
  Tensor empty = Tensor::zeros({0, 3}, Dtype::f64);
  CHECK(empty.numel() == 0);
  CHECK(empty.to_vector().empty());
  Tensor t = Tensor::from_values({2, 2}, std::vector<double>{1, 2, 3, 4}, Dtype::f64);
  CHECK(t.describe() == "f64[2, 2] on cpu");
  CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % 64 == 0);
  check_error_contains([] { Tensor::from_values({3}, std::vector<double>{1, 2}, Dtype::f32); }, "3");
}

TEST_CASE("tensor: set_data changes the layout id but keeps identity and grad") {
  Tensor p = Tensor::zeros({4}, Dtype::f32);
  p.set_grad(Tensor::zeros({4}, Dtype::f32));
  const uint64_t uid = p.uid(), layout = p.layout_id();
  p.set_data(Tensor::full({4}, 2.0, Dtype::f32));
  CHECK(p.uid() == uid);
  CHECK(p.layout_id() != layout);
  CHECK(p.grad().defined());
  CHECK(p.item(3) == 2.0);
}

TEST_CASE("tensor: views of user memory are written in place") {
  std::vector<float> memory = {1, 2, 3};
  Tensor view = Tensor::from_blob(memory.data(), {3}, Dtype::f32);
  view.fill(7);
  CHECK(memory == std::vector<float>{7, 7, 7});
}

TEST_CASE("tensor: cuda tensors on a machine without a driver are a clear error, and the CPU is unaffected") {
  if (cuda::available()) {
    optjit::test::skip_test("this machine has a CUDA driver: tests/codegen/test_cuda.cpp covers it");
    return;
  }
  check_error_contains([] { Tensor::zeros({2}, Dtype::f32, parse_device("cuda:0")); }, "no CUDA driver");
  check_error_contains([] { Tensor::full({2}, 1.0, Dtype::f32).to(Device::cuda(0)); }, "no CUDA driver");
  CHECK(Tensor::full({2}, 1.0, Dtype::f32).to(Device::cpu()).to_vector() == std::vector<double>{1, 1});
}

TEST_CASE("allocator: 64-byte alignment and reuse instead of fresh pages") {
  host_allocator_trim();
  const AllocatorStats before = host_allocator_stats();
  void* a = host_allocate(1000);
  CHECK(reinterpret_cast<std::uintptr_t>(a) % 64 == 0);
  host_release(a, 1000);
  void* b = host_allocate(1000);
  CHECK(b == a);
  CHECK(host_allocator_stats().reused == before.reused + 1);
  host_release(b, 1000);
  void* big = host_allocate(8 << 20);
  CHECK(reinterpret_cast<std::uintptr_t>(big) % (2 << 20) == 0); // huge-page aligned
  host_release(big, 8 << 20);
  host_allocator_trim();
  CHECK(host_allocator_stats().bytes_cached == 0);
}

TEST_CASE("thread pool: parallel_for covers every index once, in grains, with any thread count") {
  ThreadPool pool(4);
  for (int threads : {1, 2, 4}) {
    pool.set_active_threads(threads);
    for (int64_t n : {0, 1, 7, 1000, 100003}) {
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      std::atomic<int64_t> max_range{0};
      pool.parallel_for(n, 64, [&](int64_t b, int64_t e) {
        int64_t r = e - b, seen = max_range.load();
        while (r > seen && !max_range.compare_exchange_weak(seen, r)) {
        }
        for (int64_t i = b; i < e; ++i)
          hits[static_cast<std::size_t>(i)]++;
      });
      for (const auto& h : hits)
        REQUIRE(h.load() == 1);
      CHECK(max_range.load() <= 64);
    }
  }
}

TEST_CASE("dtype and device: parsing and clear errors") {
  CHECK(parse_dtype("float32") == Dtype::f32);
  CHECK(parse_dtype("f64") == Dtype::f64);
  CHECK(parse_dtype("bfloat16") == Dtype::bf16);
  CHECK(parse_dtype("f16") == Dtype::f16);
  check_error_contains([] { parse_dtype("fp8"); }, "fp8");
  CHECK(parse_device("cpu") == Device::cpu());
  CHECK(parse_device("cuda:1").to_string() == "cuda:1");
  check_error_contains([] { parse_device("tpu"); }, "tpu");
}

TEST_CASE("cuda driver: no library, a missing symbol and a failing call are clear errors, never a crash") {
  check_error_contains([] { probe_cuda_driver("libcuda-not-here.so.1"); },
                       "no CUDA driver: could not load libcuda-not-here.so.1");
  // libm has none of the driver's symbols: the first one is named.
  check_error_contains([] { probe_cuda_driver("libm.so.6"); }, "lacks the symbol cuInit");
  check_error([] { probe_cuda_driver(OPTJIT_TEST_FAKE_OLD_CUDA); },
              std::string("CUDA driver ") + OPTJIT_TEST_FAKE_OLD_CUDA +
                  " lacks the symbol cuGraphInstantiateWithFlags that optjit needs");
  check_error([] { probe_cuda_driver(OPTJIT_TEST_FAKE_CUDA); },
              "CUDA driver call cuInit failed with CUDA_ERROR_NO_DEVICE (100)");
}

TEST_CASE("tensor: strided views read and write through their strides, and copies are contiguous") {
  std::vector<double> memory = {0, 1, 2, 3, 4, 5};
  // The transpose of a 2x3 row-major matrix: shape 3x2, strides (1, 3).
  Tensor t = Tensor::from_blob(memory.data(), {3, 2}, Dtype::f64, {1, 3});
  CHECK_FALSE(t.is_contiguous());
  CHECK(t.to_vector() == std::vector<double>{0, 3, 1, 4, 2, 5});
  CHECK(t.describe() == "f64[3, 2] (strides [1, 3]) on cpu");
  t.set_item(1, 30);
  CHECK(memory[3] == 30);
  Tensor copy = t.clone();
  CHECK(copy.is_contiguous());
  CHECK(copy.to_vector() == std::vector<double>{0, 30, 1, 4, 2, 5});
  // Extents of 1 make any stride contiguous, as in torch.
  CHECK(Tensor::from_blob(memory.data(), {1, 3}, Dtype::f64, {7, 1}).is_contiguous());
  check_error_contains([&] { Tensor::from_blob(memory.data(), {3, 2}, Dtype::f64, {1}); }, "one stride per dimension");
}

TEST_CASE("tensor: shapes beyond the limits are refused naming the limit, never wrapped around (issue 16, 1 and 2)") {
  check_error_contains([] { Tensor::empty({(int64_t{1} << 62) - 1}, Dtype::f32); }, "2^48 bytes (kMaxTensorBytes)");
  check_error_contains([] { Tensor::empty({4294967296, 4294967296}, Dtype::f32); }, "[4294967296, 4294967296]");
  check_error_contains([] { Tensor::empty({int64_t{1} << 46}, Dtype::f64); }, "kMaxTensorBytes"); // 2^49 bytes
  check_error_contains([] { Tensor::empty(Shape(kMaxTensorRank + 1, 1), Dtype::f32); }, "at most 64 (kMaxTensorRank)");
  CHECK(Tensor::empty({0, int64_t{1} << 40}, Dtype::f64).numel() == 0); // nothing to hold, strides in range
  // No elements, but strides of 2^62 * 2^62 (found by fuzz_cli_text): refused, not overflowed.
  check_error_contains(
      [] {
        Tensor::empty({0, int64_t{1} << 62, int64_t{1} << 62}, Dtype::f64);
      },
      "its extents other than 0 span more than the largest tensor, 2^48 bytes (kMaxTensorBytes)");
  float data[4] = {};
  check_error_contains([&] { Tensor::from_blob(data, {2, 2}, Dtype::f32, {int64_t{1} << 61, 1}); }, "kMaxTensorBytes");
}

TEST_CASE("tensor: item and set_item refuse an index outside 0..numel-1, on 0-element tensors too (issue 16, 12)") {
  Tensor empty = Tensor::empty({0}, Dtype::f32);
  check_error_contains([&] { (void)empty.item(); }, "index 0 is out of range for f32[0] on cpu (0 elements)");
  Tensor ten = Tensor::zeros({10}, Dtype::f64);
  check_error_contains([&] { ten.set_item(1000, 1); }, "index 1000 is out of range");
  check_error_contains([&] { (void)ten.item(-1); }, "index -1 is out of range");
  ten.set_item(9, 2.5);
  CHECK(ten.item(9) == 2.5);
}

TEST_CASE("work items: kernels over rows and columns cut matrices into pieces of rows, or group whole ones") {
  LaunchShape shape;
  shape.axis_item_elements = 1; // items of kMinAxisItemRows rows
  // 100 rows: 4 pieces of 25; 2 batched 40-row matrices: 2 pieces of 20 each; 3 x 10-row matrices: 3 to an item
  // (floor(32 / 10)), then 1; empty: one empty item.
  const AxisWorkItems cut = make_axis_work_items({{1, 100, 3}, {2, 40, 5}, {4, 10, 2}, {1, 0, 4}}, shape);
  const std::vector<WorkItem> expected = {{0, 0, 75},  {0, 75, 150},  {0, 150, 225}, {0, 225, 300}, // 25 rows
                                          {1, 0, 100}, {1, 100, 200}, {1, 200, 300}, {1, 300, 400}, // 20 rows
                                          {2, 0, 60},  {2, 60, 80},                                 // 3, then 1
                                          {3, 0, 0}};
  REQUIRE(cut.items.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("item " << i);
    CHECK(cut.items[i].tensor == expected[i].tensor);
    CHECK(cut.items[i].begin == expected[i].begin);
    CHECK(cut.items[i].end == expected[i].end);
  }
  CHECK(cut.pieces == std::vector<int64_t>{4, 2, 1, 1});
  // Rows of about axis_item_elements elements: 1000 x 512 at 32768 elements per item is 64 rows a piece.
  shape.axis_item_elements = 32768;
  const AxisWorkItems big = make_axis_work_items({{1, 1000, 512}}, shape);
  CHECK(big.pieces == std::vector<int64_t>{16});
  CHECK(big.items.front().end == 63 * 512); // 16 pieces of ceil(1000 / 16) = 63 rows, the last of 55
  CHECK(big.items.back().end - big.items.back().begin == 55 * 512);
}
