// runtime/cuda/cublas.h without a GPU: the row-major products optjit asks for, translated into cuBLAS's column-major
// calls, run by tests/runtime/fake_cublas (cuBLAS's ABI and documented semantics on host memory) and checked against
// the exact sum as the CPU library's are (gemm_reference.h): every transpose, batches, addmm's coefficients, bf16
// and f32, an empty sum. Then the stream a product is queued on, and the errors. On a GPU, test_cuda.cpp runs the
// real library.
#include "runtime/cuda/cublas.h"
#include "runtime/error.h"
#include "runtime/gemm_reference.h"

#include <doctest/doctest.h>

#include <dlfcn.h>

#include <climits>

using namespace optjit;
using namespace optjit::test;

namespace {

const cuda::BlasLibrary& fake_library() {
  static const cuda::BlasLibrary library(OPTJIT_TEST_FAKE_CUBLAS);
  return library;
}

// One of the fake's own functions, for what a test asks it.
template <typename F> F* fake_function(const char* name) {
  void* handle = dlopen(OPTJIT_TEST_FAKE_CUBLAS, RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(handle != nullptr);
  auto* f = reinterpret_cast<F*>(dlsym(handle, name));
  dlclose(handle);
  const bool found = f != nullptr;
  REQUIRE(found);
  return f;
}

void* const kStream = reinterpret_cast<void*>(0x5eed);

// The product through a handle of the fake library: host addresses stand for device addresses.
void run_on_fake_cublas(const GemmShape& shape, const void* a, const void* b, void* c) {
  const cuda::BlasHandle handle(0, fake_library());
  handle.gemm(shape, reinterpret_cast<uint64_t>(a), reinterpret_cast<uint64_t>(b), reinterpret_cast<uint64_t>(c),
              kStream);
}

} // namespace

TEST_CASE("cublas: row-major products through cuBLAS's column-major call equal the exact sum, for every transpose") {
  check_every_transpose_and_dtype(run_on_fake_cublas);
}

TEST_CASE("cublas: batches of strided matrices, one-wide shapes, and addmm's alpha and beta") {
  check_product({.batch = 3, .m = 5, .n = 7, .k = 3, .transpose_b = true, .operands = Dtype::bf16}, 3,
                run_on_fake_cublas);
  check_product(
      {.batch = 4, .m = 64, .n = 48, .k = 96, .transpose_a = true, .operands = Dtype::bf16, .result = Dtype::bf16}, 4,
      run_on_fake_cublas);
  check_product({.batch = 1, .m = 1, .n = 300, .k = 1, .operands = Dtype::f32}, 5, run_on_fake_cublas);
  check_product({.batch = 2, .m = 300, .n = 1, .k = 17, .transpose_a = true, .operands = Dtype::f32}, 6,
                run_on_fake_cublas);
  // Muon's three: the Gram matrix X X^T, B = b A + c A A (addmm), X = a X + B X (addmm), on a batch of 2.
  check_product(
      {.batch = 2, .m = 24, .n = 24, .k = 40, .transpose_b = true, .operands = Dtype::bf16, .result = Dtype::bf16}, 7,
      run_on_fake_cublas);
  check_product({.batch = 2,
                 .m = 24,
                 .n = 24,
                 .k = 24,
                 .operands = Dtype::bf16,
                 .result = Dtype::bf16,
                 .alpha = 2.0315,
                 .beta = -4.775},
                8, run_on_fake_cublas);
  check_product({.batch = 2, .m = 24, .n = 40, .k = 24, .operands = Dtype::bf16, .result = Dtype::bf16, .beta = 3.4445},
                9, run_on_fake_cublas);
  check_product({.m = 9, .n = 5, .k = 7, .transpose_a = true, .operands = Dtype::f32, .alpha = -0.5, .beta = 0.25}, 23,
                run_on_fake_cublas);
}

TEST_CASE("cublas: a product is queued on the caller's stream, an empty sum scales C by beta, no rows is nothing") {
  const cuda::BlasHandle handle(0, fake_library());
  CHECK(fake_function<int()>("fake_cublas_handles")() >= 1);
  const int before = fake_function<int()>("fake_cublas_products")();
  std::vector<float> a = {1, 2}, b = {3, 4}, c = {0};
  handle.gemm({.m = 1, .n = 1, .k = 2, .operands = Dtype::f32}, reinterpret_cast<uint64_t>(a.data()),
              reinterpret_cast<uint64_t>(b.data()), reinterpret_cast<uint64_t>(c.data()), kStream);
  CHECK(c[0] == 11.0f);
  CHECK(fake_function<int()>("fake_cublas_products")() == before + 1);
  CHECK(fake_function<void*()>("fake_cublas_last_stream")() == kStream);
  // k of 0: beta C, through cublasScalEx over the whole batch; no product is asked of cuBLAS.
  std::vector<float> scaled = {1, 2, 3, 4, 5, 6};
  void* const other = reinterpret_cast<void*>(0xcafe);
  handle.gemm({.batch = 2, .m = 3, .n = 1, .k = 0, .operands = Dtype::f32, .beta = 0.5}, 0, 0,
              reinterpret_cast<uint64_t>(scaled.data()), other);
  CHECK(scaled == std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3});
  CHECK(fake_function<void*()>("fake_cublas_last_stream")() == other);
  handle.gemm({.m = 0, .n = 3, .k = 4, .operands = Dtype::bf16}, 0, 0, 0, kStream);
  CHECK(fake_function<int()>("fake_cublas_products")() == before + 1);
}

TEST_CASE("cublas: a missing library, a missing function, a failing call and a size beyond int are clear errors") {
  CHECK_THROWS_WITH_AS(cuda::BlasLibrary("/nonexistent/libcublas.so.12"),
                       doctest::Contains("/nonexistent/libcublas.so.12 does not load"), Error);
  CHECK_THROWS_WITH_AS(cuda::BlasLibrary("/nonexistent/libcublas.so.12"), doctest::Contains("OPTJIT_CUBLAS_LIBRARY"),
                       Error);
  CHECK_THROWS_WITH_AS(cuda::BlasLibrary(OPTJIT_TEST_FAKE_CUDA), doctest::Contains("has no cublasCreate_v2"), Error);
  const cuda::BlasHandle handle(0, fake_library());
  std::vector<float> a(4, 1), b(4, 1), c(4, 7);
  const GemmShape shape{.m = 2, .n = 2, .k = 2, .operands = Dtype::f32};
  fake_function<void(int)>("fake_cublas_fail_next")(13);
  CHECK_THROWS_WITH_AS(handle.gemm(shape, reinterpret_cast<uint64_t>(a.data()), reinterpret_cast<uint64_t>(b.data()),
                                   reinterpret_cast<uint64_t>(c.data()), kStream),
                       doctest::Contains("cublasGemmStridedBatchedEx failed with CUBLAS_STATUS_EXECUTION_FAILED (13) "
                                         "for the product f32 [1] 2x2"),
                       Error);
  CHECK(c == std::vector<float>(4, 7));
  CHECK_THROWS_WITH_AS(
      handle.gemm({.batch = int64_t{INT_MAX} + 1, .m = 1, .n = 1, .k = 1, .operands = Dtype::f32}, 1, 1, 1, kStream),
      doctest::Contains("cuBLAS takes sizes and batch counts up to 2147483647"), Error);
  CHECK_THROWS_WITH_AS(handle.gemm({.m = 2, .n = 2, .k = 2, .operands = Dtype::f16}, 1, 1, 1, kStream),
                       doctest::Contains("takes bf16 or f32 operands, not f16"), Error);
}
