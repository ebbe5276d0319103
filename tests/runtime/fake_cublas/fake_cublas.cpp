// A stand-in for libcublas with the cuBLAS ABI and semantics optjit uses, on host memory: "device pointers" are
// host addresses, a product runs at once on the calling thread. It is a reference, written from cuBLAS's
// documentation and independent of optjit: column-major matrices, op(X) by cublasOperation_t, the argument checks
// cuBLAS makes (CUBLAS_STATUS_INVALID_VALUE for a leading dimension below its matrix's rows), f32 accumulation
// (CUBLAS_COMPUTE_32F) and one rounding of alpha * sum + beta * C to the result's type. So runtime/cuda/cublas.cpp's
// translation of row-major products to cuBLAS's calls is checked without a GPU. It also answers what a test asks
// about the last calls (fake_cublas_*).
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

constexpr int kSuccess = 0, kNotInitialized = 1, kInvalidValue = 7, kNotSupported = 15;
constexpr int kOpN = 0, kOpT = 1;
constexpr int kR32F = 0, kR16BF = 14;
constexpr int kCompute32F = 68;

struct Handle {
  void* stream = nullptr;
};

int g_handles = 0;             // alive
int g_products = 0;            // cublasGemmStridedBatchedEx calls that ran
void* g_last_stream = nullptr; // the stream of the last call that ran
int g_fail_next = 0;           // a status the next product returns instead of running

float load(const void* base, int type, long long index) {
  if (type == kR32F)
    return static_cast<const float*>(base)[index];
  uint16_t bits;
  std::memcpy(&bits, static_cast<const unsigned char*>(base) + 2 * index, 2);
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

void store(void* base, int type, long long index, float value) {
  if (type == kR32F) {
    static_cast<float*>(base)[index] = value;
    return;
  }
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  uint16_t rounded;
  if (std::isnan(value))
    rounded = static_cast<uint16_t>((bits >> 16) | 0x40); // quiet
  else
    rounded = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16); // to nearest, ties to even
  std::memcpy(static_cast<unsigned char*>(base) + 2 * index, &rounded, 2);
}

int at_least_one(int v) { return v > 1 ? v : 1; }

} // namespace

extern "C" {

int cublasCreate_v2(Handle** handle) {
  *handle = new Handle;
  ++g_handles;
  return kSuccess;
}

int cublasDestroy_v2(Handle* handle) {
  if (!handle)
    return kNotInitialized;
  delete handle;
  --g_handles;
  return kSuccess;
}

int cublasSetStream_v2(Handle* handle, void* stream) {
  if (!handle)
    return kNotInitialized;
  handle->stream = stream;
  return kSuccess;
}

const char* cublasGetStatusName(int status) {
  switch (status) {
  case kSuccess:
    return "CUBLAS_STATUS_SUCCESS";
  case kInvalidValue:
    return "CUBLAS_STATUS_INVALID_VALUE";
  case kNotSupported:
    return "CUBLAS_STATUS_NOT_SUPPORTED";
  case 13:
    return "CUBLAS_STATUS_EXECUTION_FAILED";
  default:
    return "CUBLAS_STATUS_UNKNOWN";
  }
}

int cublasScalEx(Handle* handle, int n, const void* alpha, int alpha_type, void* x, int x_type, int incx,
                 int execution_type) {
  if (!handle)
    return kNotInitialized;
  if (alpha_type != kR32F || execution_type != kR32F || (x_type != kR32F && x_type != kR16BF))
    return kNotSupported;
  if (n < 0 || incx <= 0)
    return kInvalidValue;
  const float a = *static_cast<const float*>(alpha);
  for (long long i = 0; i < n; ++i)
    store(x, x_type, i * incx, a * load(x, x_type, i * incx));
  g_last_stream = handle->stream;
  return kSuccess;
}

// C[q] = alpha op(A[q]) op(B[q]) + beta C[q], column-major: C is m x n, op(A) m x k, op(B) k x n.
int cublasGemmStridedBatchedEx(Handle* handle, int transa, int transb, int m, int n, int k, const void* alpha,
                               const void* a, int a_type, int lda, long long stride_a, const void* b, int b_type,
                               int ldb, long long stride_b, const void* beta, void* c, int c_type, int ldc,
                               long long stride_c, int batch, int compute, int /*algo*/) {
  if (!handle)
    return kNotInitialized;
  if (const int status = g_fail_next; status != 0) {
    g_fail_next = 0;
    return status;
  }
  if ((transa != kOpN && transa != kOpT) || (transb != kOpN && transb != kOpT) || m < 0 || n < 0 || k < 0 || batch < 0)
    return kInvalidValue;
  if (lda < at_least_one(transa == kOpN ? m : k) || ldb < at_least_one(transb == kOpN ? k : n) || ldc < at_least_one(m))
    return kInvalidValue;
  // The combinations this stand-in knows: bf16 or f32 operands of one type, f32 compute, f32 or bf16 (of bf16) C.
  if (compute != kCompute32F || a_type != b_type || (a_type != kR32F && a_type != kR16BF) ||
      (c_type != kR32F && c_type != a_type))
    return kNotSupported;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  for (int q = 0; q < batch; ++q)
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float sum = 0;
        for (int p = 0; p < k; ++p) {
          const long long ai =
              transa == kOpN ? i + static_cast<long long>(p) * lda : p + static_cast<long long>(i) * lda;
          const long long bi =
              transb == kOpN ? p + static_cast<long long>(j) * ldb : j + static_cast<long long>(p) * ldb;
          sum = std::fma(load(a, a_type, q * stride_a + ai), load(b, b_type, q * stride_b + bi), sum);
        }
        const long long ci = q * stride_c + i + static_cast<long long>(j) * ldc;
        const float old = be == 0.0f ? 0.0f : load(c, c_type, ci); // beta 0: C is not read (it may hold NaN)
        store(c, c_type, ci, al * sum + be * old);
      }
  ++g_products;
  g_last_stream = handle->stream;
  return kSuccess;
}

// For the tests.
int fake_cublas_handles() { return g_handles; }
int fake_cublas_products() { return g_products; }
void* fake_cublas_last_stream() { return g_last_stream; }
void fake_cublas_fail_next(int status) { g_fail_next = status; }

} // extern "C"
