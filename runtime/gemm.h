// Matrix products from a well-kept library, never from hand-written loops: a plan's matrix multiplies (Muon's
// Newton-Schulz iterations) run here between its pointwise kernels. On the CPU the library is oneDNN (Debian 12's
// libdnnl2: its matmul primitive runs bf16 products on AMX or AVX512-BF16 where the CPU has them, with f32
// accumulation), loaded with dlopen on first use like the CUDA driver, so that a build or a step without matrix
// products never needs it.
//
// A Gemm is prepared once (when a step compiles: the library picks its kernel for the shape) and run many times,
// from any thread, several at once. It computes torch.addmm's C = beta C + alpha op(A) op(B) in f32 and rounds once
// to C's dtype, as torch's CPU addmm does through the same library (C copied from addmm's input first); alpha and
// beta are fixed when it is prepared (oneDNN 2.x fixes the scale of its sum when the primitive is made).
#pragma once

#include "runtime/dtype.h"

#include <cstdint>
#include <memory>
#include <string>

namespace optjit {

// C[i] = beta C[i] + alpha op(A[i]) op(B[i]) for i < batch: every matrix dense and row-major, each operand's matrices
// one after another.
struct GemmShape {
  int64_t batch = 1;
  int64_t m = 0, n = 0, k = 0;  // C is m x n, op(A) m x k, op(B) k x n
  bool transpose_a = false;     // A is stored k x m and read transposed
  bool transpose_b = false;     // B is stored n x k and read transposed
  Dtype operands = Dtype::bf16; // A's and B's dtype: bf16 or f32
  Dtype result = Dtype::f32;    // C's: f32, or bf16 (the f32 sum rounded once, to nearest even), as torch's bf16 mm
  double alpha = 1.0;           // applied in f32, as torch's addmm
  double beta = 0.0;            // 0: C is only written
  bool operator==(const GemmShape&) const = default;
  std::string to_string() const; // "bf16 [4] 768x768 = 768x3072 @ (3072x768)^T -> bf16"
};

// Throws optjit::Error naming the shape and the rule it breaks: a negative size, an operand dtype other than bf16 or
// f32, a bf16 result of f32 operands. Every library's product checks it first.
void check_gemm_shape(const GemmShape& shape);

class Gemm {
public:
  // Prepares the product on the CPU. Throws optjit::Error naming the shape and the rule when it breaks one (a
  // negative size, an operand dtype other than bf16 or f32, a bf16 result of f32 operands), or naming the library
  // when it is missing or refuses.
  explicit Gemm(const GemmShape& shape);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // C = beta C + alpha op(A) op(B) (C is not read when beta is 0; an empty sum, k of 0, is 0). The pointers hold
  // shape().batch matrices each; C may not overlap A or B.
  void run(const void* a, const void* b, void* c) const;

  const GemmShape& shape() const { return shape_; }
  // The library's kernel for this shape, as it names it ("brg:avx512_core_amx_bf16"); "none" for an empty product;
  // with " (bf16 widened to f32)" where the CPU has no bf16 kernel (see gemm_onednn.cpp).
  const std::string& implementation() const { return implementation_; }

private:
  struct Primitive;
  struct ThreadContext;
  static std::unique_ptr<Primitive> make_primitive(const GemmShape& shape, std::string& implementation);
  void run_widened(const void* a, const void* b, void* c, ThreadContext& context) const;
  void execute(const void* a, const void* b, void* c, ThreadContext& context) const;

  GemmShape shape_;
  std::string implementation_;
  std::unique_ptr<Primitive> primitive_; // none for an empty product (a size of 0)
  bool widened_ = false;                 // bf16 products run as f32 ones: the CPU has no bf16 kernel
};

// The process's prepared product of `shape`, made on its first use and kept (a step runs the same few shapes every
// time; preparing one costs the library's kernel choice, milliseconds). Thread-safe.
const Gemm& prepared_gemm(const GemmShape& shape);

// Whether the CPU's matrix library loads (never throws): the process's, loaded once, from OPTJIT_ONEDNN_LIBRARY or
// libdnnl.so.2.
bool gemm_library_available();
// Loads `library` as the process's would be, apart from it: throws the optjit::Error a product would meet (naming
// the library and how to install it, or the function it lacks).
void probe_gemm_library(const std::string& library);

} // namespace optjit
