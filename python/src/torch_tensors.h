// torch tensors seen as optjit tensors: zero-copy views of their memory, read through torch's Python API (the C++
// build never links libtorch). The caller keeps the torch tensor alive as long as the view is used.
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
  Dtype dtype_of(nb::handle torch_dtype, const std::string& what) const;
  // optjit's device for a torch.device: the CPU or cuda:N; an optjit::Error naming `what` for another.
  static Device device_of(nb::handle torch_device, const std::string& what);
  // A view of a strided tensor's memory, on the CPU or a CUDA device (its device address); optjit::Error naming
  // `what` for another layout or device.
  Tensor view(nb::handle tensor, const std::string& what) const;
  // The address of a tensor's first element (Tensor.data_ptr()).
  static uintptr_t data_ptr(nb::handle tensor);

private:
  nb::object tensor_type_, strided_, dtensor_type_, plain_dispatch_;
  std::vector<std::pair<nb::object, Dtype>> dtypes_; // torch's dtype objects optjit runs, by the dtype table
};

} // namespace optjit::python
