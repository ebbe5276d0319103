// runtime/cuda/cublas.h: the library's table of functions (typed from cuBLAS's own header where the build has it,
// so a signature that changed would not compile), the row-major product as cuBLAS's column-major one, and every
// status that is not success turned into an optjit::Error naming the call.
#include "runtime/cuda/cublas.h"
#include "runtime/error.h"

#include <dlfcn.h>
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <vector>

#ifdef OPTJIT_HAVE_CUBLAS_H
#include <cublas_api.h>
#endif

namespace optjit::cuda {
namespace {

#ifdef OPTJIT_HAVE_CUBLAS_H
using Status = cublasStatus_t;
using Handle = cublasHandle_t;
using CudaStream = cudaStream_t;
using Operation = cublasOperation_t;
using DataType = cudaDataType;
using ComputeType = cublasComputeType_t;
using Algorithm = cublasGemmAlgo_t;
#else
// cuBLAS's C types as its header declares them (enums are int-sized, the handle and the stream are pointers).
using Status = int;
using Handle = struct cublasContext*;
using CudaStream = struct CUstream_st*;
using Operation = int;
using DataType = int;
using ComputeType = int;
using Algorithm = int;
#endif

// Values of cuBLAS's and CUDA's enums that optjit passes (fixed by their ABI).
constexpr auto kOpN = Operation(0), kOpT = Operation(1);   // CUBLAS_OP_N, CUBLAS_OP_T
constexpr auto kR32F = DataType(0), kR16BF = DataType(14); // CUDA_R_32F, CUDA_R_16BF
constexpr auto kCompute32F = ComputeType(68);              // CUBLAS_COMPUTE_32F
constexpr auto kGemmDefault = Algorithm(-1);               // CUBLAS_GEMM_DEFAULT
constexpr auto kSuccess = Status(0);                       // CUBLAS_STATUS_SUCCESS

} // namespace

// Every cuBLAS function optjit uses, by the symbol it is looked up by.
#define OPTJIT_CUBLAS_FUNCTIONS(X)                                                                                     \
  X(cublasCreate_v2, (Handle*))                                                                                        \
  X(cublasDestroy_v2, (Handle))                                                                                        \
  X(cublasSetStream_v2, (Handle, CudaStream))                                                                          \
  X(cublasScalEx, (Handle, int, const void*, DataType, void*, DataType, int, DataType))                                \
  X(cublasGemmStridedBatchedEx,                                                                                        \
    (Handle, Operation, Operation, int, int, int, const void*, const void*, DataType, int, long long, const void*,     \
     DataType, int, long long, const void*, void*, DataType, int, long long, int, ComputeType, Algorithm))

struct BlasFunctions {
#define OPTJIT_DECLARE(name, params) Status(*name) params = nullptr;
  OPTJIT_CUBLAS_FUNCTIONS(OPTJIT_DECLARE)
#undef OPTJIT_DECLARE
  const char* (*cublasGetStatusName)(Status) = nullptr; // cuBLAS 11.4.2 on; the number alone before
};

namespace {

#ifdef OPTJIT_HAVE_CUBLAS_H
// Every entry must be the header's function (the overload of its signature), or a call through the table would be
// undefined; and the enum values must be the header's.
#define OPTJIT_CHECK_SIGNATURE(name, params)                                                                           \
  [[maybe_unused]] constexpr decltype(BlasFunctions::name) kChecked_##name = &::name;
OPTJIT_CUBLAS_FUNCTIONS(OPTJIT_CHECK_SIGNATURE)
#undef OPTJIT_CHECK_SIGNATURE
static_assert(CUBLAS_OP_N == kOpN && CUBLAS_OP_T == kOpT && CUDA_R_32F == kR32F && CUDA_R_16BF == kR16BF &&
              CUBLAS_COMPUTE_32F == kCompute32F && CUBLAS_GEMM_DEFAULT == kGemmDefault &&
              CUBLAS_STATUS_SUCCESS == kSuccess);
#endif

// `what`: the product it was for, or what the call was doing.
void check(const BlasFunctions& f, Status status, const char* call, const std::string& what) {
  if (status == kSuccess)
    return;
  const char* name = f.cublasGetStatusName ? f.cublasGetStatusName(status) : nullptr;
  throw Error(
      fmt::format("cuBLAS's {} failed with {} ({}) {}", call, name ? name : "error", static_cast<int>(status), what));
}

// A product's call: the product is named only when the call failed (products run many times per step).
void check(const BlasFunctions& f, Status status, const char* call, const GemmShape& shape) {
  if (status != kSuccess)
    check(f, status, call, "for the product " + shape.to_string());
}

DataType data_type(Dtype dtype) { return dtype == Dtype::bf16 ? kR16BF : kR32F; }

// A size cuBLAS takes as an int.
int as_int(int64_t value, const GemmShape& shape) {
  if (value > INT_MAX)
    throw Error(fmt::format("the matrix product {} on a GPU: cuBLAS takes sizes and batch counts up to {}, and {} is "
                            "more",
                            shape.to_string(), INT_MAX, value));
  return static_cast<int>(value);
}

} // namespace

BlasLibrary::BlasLibrary(const std::string& path) : path_(path), functions_(std::make_unique<BlasFunctions>()) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    throw Error("matrix multiplies on a GPU run in cuBLAS, and " + path + " does not load (" +
                (why ? why : "no reason given") +
                "): import torch first (its CUDA wheels bring libcublas), install the CUDA toolkit's, or set "
                "OPTJIT_CUBLAS_LIBRARY to its path");
  }
#define OPTJIT_RESOLVE(name, params)                                                                                   \
  functions_->name = reinterpret_cast<decltype(functions_->name)>(dlsym(handle, #name));                               \
  if (!functions_->name) {                                                                                             \
    dlclose(handle);                                                                                                   \
    throw Error("cuBLAS library " + path + " has no " #name ": optjit needs cuBLAS 11 or later");                      \
  }
  OPTJIT_CUBLAS_FUNCTIONS(OPTJIT_RESOLVE)
#undef OPTJIT_RESOLVE
  functions_->cublasGetStatusName =
      reinterpret_cast<decltype(functions_->cublasGetStatusName)>(dlsym(handle, "cublasGetStatusName"));
}

BlasLibrary::~BlasLibrary() = default;

const BlasLibrary& BlasLibrary::process() {
  static std::once_flag once;
  static BlasLibrary* library = nullptr; // for the process: handles may outlive static destruction
  static std::string failure;
  std::call_once(once, [] {
    const char* configured = std::getenv("OPTJIT_CUBLAS_LIBRARY");
    // One the process has loaded already (torch's) comes first: a second cuBLAS would cost memory and start-up.
    std::vector<std::string> names, not_loaded;
    for (const char* name : {"libcublas.so.13", "libcublas.so.12"}) {
      void* loaded = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
      (loaded ? names : not_loaded).push_back(name);
      if (loaded)
        dlclose(loaded);
    }
    names.insert(names.end(), not_loaded.begin(), not_loaded.end());
    if (configured && *configured)
      names = {configured};
    for (const std::string& name : names) {
      try {
        library = new BlasLibrary(name);
        return;
      } catch (const Error& e) {
        failure += (failure.empty() ? "" : "; ") + std::string(e.what());
      }
    }
  });
  if (!library)
    throw Error(failure);
  return *library;
}

bool blas_available() {
  try {
    BlasLibrary::process();
    return true;
  } catch (const Error&) {
    return false;
  }
}

BlasHandle::BlasHandle(int device, const BlasLibrary& library) : device_(device), library_(&library) {
  Handle handle = nullptr;
  check(library.functions(), library.functions().cublasCreate_v2(&handle), "cublasCreate_v2",
        "making a handle for cuda:" + std::to_string(device));
  handle_ = handle;
}

BlasHandle::~BlasHandle() {
  if (handle_)
    (void)library_->functions().cublasDestroy_v2(static_cast<Handle>(handle_));
}

void BlasHandle::gemm(const GemmShape& shape, DevicePtr a, DevicePtr b, DevicePtr c, Stream stream) const {
  check_gemm_shape(shape);
  const BlasFunctions& f = library_->functions();
  const auto handle = static_cast<Handle>(handle_);
  const int64_t count = shape.batch * shape.m * shape.n; // C's elements
  if (count == 0)
    return;
  const float alpha = static_cast<float>(shape.alpha), beta = static_cast<float>(shape.beta);
  check(f, f.cublasSetStream_v2(handle, static_cast<CudaStream>(stream)), "cublasSetStream_v2", shape);
  if (shape.k == 0) { // an empty sum: beta C
    const std::size_t element = dtype_size(shape.result);
    if (beta == 0.0f)
      return memset_zero_async(device_, c, static_cast<std::size_t>(count) * element, stream);
    for (int64_t done = 0; done < count; done += INT_MAX) {
      const int n = static_cast<int>(std::min<int64_t>(INT_MAX, count - done));
      check(f,
            f.cublasScalEx(handle, n, &beta, kR32F, reinterpret_cast<void*>(c + static_cast<uint64_t>(done) * element),
                           data_type(shape.result), 1, kR32F),
            "cublasScalEx", shape);
    }
    return;
  }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS reads each row-major matrix as its
  // transpose, so B comes first, A second, and C (m x n, rows of n) is cuBLAS's n x m with leading dimension n.
  // A row-major matrix of r rows and c columns has leading dimension c.
  const int64_t lda = shape.transpose_b ? shape.k : shape.n; // B stored n x k (read transposed) or k x n
  const int64_t ldb = shape.transpose_a ? shape.m : shape.k; // A stored k x m (read transposed) or m x k
  check(f,
        f.cublasGemmStridedBatchedEx(handle, shape.transpose_b ? kOpT : kOpN, shape.transpose_a ? kOpT : kOpN,
                                     as_int(shape.n, shape), as_int(shape.m, shape), as_int(shape.k, shape), &alpha,
                                     reinterpret_cast<const void*>(b), data_type(shape.operands), as_int(lda, shape),
                                     shape.k * shape.n, reinterpret_cast<const void*>(a), data_type(shape.operands),
                                     as_int(ldb, shape), shape.m * shape.k, &beta, reinterpret_cast<void*>(c),
                                     data_type(shape.result), as_int(shape.n, shape), shape.m * shape.n,
                                     as_int(shape.batch, shape), kCompute32F, kGemmDefault),
        "cublasGemmStridedBatchedEx", shape);
}

} // namespace optjit::cuda
