// torch tensors seen as optjit tensors: zero-copy views of their memory, read through torch's Python API (the C++
// build never links libtorch). The caller keeps the torch tensor alive as long as the view is used.
//
// A step reads every param's grad, and a new grad's layout, through this API each time it runs: for 10,000 params
// that is tens of thousands of Python calls per step. So each read is one attribute lookup by an interned name or one
// method call without arguments, answered from the C API (tuples, ints, identities), with no string made on the way.
#pragma once

#include "runtime/tensor.h"

#include <nanobind/nanobind.h>

#include <string>
#include <utility>
#include <vector>

namespace optjit::python {

namespace nb = nanobind;

// str(object), for messages.
inline std::string text(nb::handle object) { return nb::str(object).c_str(); }

class TorchTensors {
public:
  TorchTensors(); // imports torch

  bool is_tensor(nb::handle object) const;
  // The local tensor of a DTensor (FSDP2's sharded params and their grads and state), the tensor itself otherwise.
  nb::object local(nb::handle tensor) const;
  // optjit's dtype for torch's; an optjit::Error naming `what` for a dtype optjit does not run yet.
  Dtype dtype_of(nb::handle torch_dtype, const std::string& what, bool codes = false) const;
  // torch's lazy bits of a tensor (torch._neg_view, `.conj()`, and `.conj().imag` of a complex tensor): its memory
  // holds the negated or conjugated values, which torch resolves as it reads and writes.
  struct LazyBits {
    bool negated = false, conjugated = false;
    bool any() const { return negated || conjugated; }
  };
  LazyBits lazy_bits(nb::handle tensor) const;
  // A view of a strided tensor's memory, on the CPU or a CUDA device (its device address); optjit::Error naming
  // `what` for another layout or device, or for a tensor with a lazy bit (the caller reads such a tensor through
  // resolved(), or stages it). With `bits`, the tensor's lazy bits as the caller read them already.
  Tensor view(nb::handle tensor, const std::string& what) const { return view(tensor, what, lazy_bits(tensor)); }
  Tensor view(nb::handle tensor, const std::string& what, LazyBits bits) const;
  // The view of the codes of block-quantized state (a torchao state tensor's `codes`: uint8 or float8_e4m3fn), which
  // view() refuses everywhere else.
  Tensor codes_view(nb::handle tensor, const std::string& what) const;
  // Whether `tensor` (a torch.Tensor) holds codes: its dtype is uint8 or float8_e4m3fn.
  bool holds_codes(nb::handle tensor) const;
  // The address of a tensor's first element (Tensor.data_ptr()).
  uintptr_t data_ptr(nb::handle tensor) const;
  // A new tensor holding the values of `tensor`, which has a lazy bit, with its bits resolved (not an alias).
  nb::object resolved(nb::handle tensor) const;
  // Whether `view` (made of `tensor` by view()) still points at its memory: the same address. torch can give the
  // same Python object other memory (`t.data = other`, `t.set_(other)`, `t.data.resize_` growing,
  // `t.untyped_storage().resize_`), and a view made before would then point at freed memory. The address alone: a
  // shape, dtype or lazy bit changed at the same address leaves that memory alive, and reading them too would cost
  // ~0.5 us per call, tripling the dispatch of a 2,000-param step (1.7 -> 4.6 ms measured).
  bool still_views(nb::handle tensor, const Tensor& view) const;
  // `tensor.grad` (None or a tensor).
  nb::object grad(nb::handle tensor) const { return attr(tensor, names_.grad); }

private:
  struct Names { // interned attribute names
    nb::object grad, data_ptr, shape, stride, layout, dtype, device, is_cpu, is_cuda, get_device, local_tensor,
        torch_dispatch, is_neg, is_conj, resolve_neg, resolve_conj;
  };
  static nb::object attr(nb::handle object, const nb::object& name);
  static nb::object call(nb::handle object, const nb::object& name);
  Device device_of(nb::handle tensor, const std::string& what) const;
  // Whether tensors of `type` have no dispatch of their own (torch.Tensor's and nn.Parameter's): remembered per type.
  bool plain_dispatch(nb::handle type) const;

  Names names_;
  nb::object tensor_type_, strided_, dtensor_type_, plain_dispatch_;
  std::vector<std::pair<nb::object, Dtype>> dtypes_; // torch's dtype objects optjit runs, by the dtype table
  mutable std::vector<nb::object> plain_types_;      // types plain_dispatch() said yes to
};

} // namespace optjit::python
