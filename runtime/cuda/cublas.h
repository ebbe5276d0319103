// Matrix products on a CUDA device: cuBLAS, loaded at run time with dlopen like the driver, so that a build or a
// step without products on a GPU never needs it. runtime/gemm.h's GemmShape (row-major, batched, torch.addmm's beta
// and alpha) becomes one cublasGemmStridedBatchedEx queued on the caller's stream: bf16 operands with f32
// accumulation (CUBLAS_COMPUTE_32F, the default math mode: no TF32 for f32 operands), the result written in bf16 or
// f32, as torch's CUDA mm and addmm do through the same library. The default math mode lets cuBLAS reduce bf16
// products in reduced precision in some kernels (split-k: not rounded once), as torch allows by default
// (torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction); optjit keeps torch's choice.
#pragma once

#include "runtime/cuda/cuda_driver.h"
#include "runtime/gemm.h"

#include <memory>
#include <string>

namespace optjit::cuda {

struct BlasFunctions;

// A loaded libcublas: its functions, for the process's life (the library is never closed).
class BlasLibrary {
public:
  // Loads `path`. Throws optjit::Error naming it and why it does not load, or the function it lacks.
  explicit BlasLibrary(const std::string& path);
  ~BlasLibrary();
  BlasLibrary(const BlasLibrary&) = delete;
  BlasLibrary& operator=(const BlasLibrary&) = delete;

  // The process's: OPTJIT_CUBLAS_LIBRARY, else libcublas.so.13 or libcublas.so.12: one the process has loaded
  // already (torch's CUDA wheels bring one, and torch loads it) first, else the first that loads. A failed load is
  // remembered and every later use throws the same error.
  static const BlasLibrary& process();
  const std::string& path() const { return path_; }
  const BlasFunctions& functions() const { return *functions_; }

private:
  std::string path_;
  std::unique_ptr<BlasFunctions> functions_;
};

// A cuBLAS handle for cuda:`device`. cuBLAS ties a handle to the context current when it is made: make the
// device's current first (make_current). One thread at a time: its stream is set for each product.
class BlasHandle {
public:
  explicit BlasHandle(int device, const BlasLibrary& library = BlasLibrary::process());
  ~BlasHandle();
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;

  // C = beta C + alpha op(A) op(B) for each of shape.batch row-major matrices (runtime/gemm.h), queued on `stream`
  // after the work queued there before it; returns at once. An empty sum (k of 0) leaves beta C (zeros when beta is 0,
  // written by the driver, not cuBLAS: torch does not ask cuBLAS for an empty sum either). Throws
  // optjit::Error for a shape check_gemm_shape refuses, a size beyond cuBLAS's 32-bit int, or a failing call (with
  // cuBLAS's status name).
  void gemm(const GemmShape& shape, DevicePtr a, DevicePtr b, DevicePtr c, Stream stream) const;

private:
  int device_;
  const BlasLibrary* library_;
  void* handle_ = nullptr;
};

// Whether the process's cuBLAS loads (never throws).
bool blas_available();

} // namespace optjit::cuda
