#include "torch_tensors.h"
#include "runtime/error.h"

#include <nanobind/stl/string.h>

namespace optjit::python {

TorchTensors::TorchTensors() {
  nb::module_ torch = nb::module_::import_("torch");
  tensor_type_ = torch.attr("Tensor");
  strided_ = torch.attr("strided");
  plain_dispatch_ = tensor_type_.attr("__torch_dispatch__"); // torch.Tensor's and nn.Parameter's: none of their own
#define OPTJIT_DTYPE(name, type, torch_name, safetensors_code)                                                         \
  dtypes_.emplace_back(torch.attr(torch_name), Dtype::name);
#include "runtime/dtypes.def"
#undef OPTJIT_DTYPE
  try {
    dtensor_type_ = nb::module_::import_("torch.distributed.tensor").attr("DTensor");
  } catch (const nb::python_error&) {
    dtensor_type_ = nb::none(); // a torch built without distributed support has no DTensor
  }
}

bool TorchTensors::is_tensor(nb::handle object) const {
  return PyObject_IsInstance(object.ptr(), tensor_type_.ptr()) == 1;
}

nb::object TorchTensors::local(nb::handle tensor) const {
  if (!dtensor_type_.is_none() && PyObject_IsInstance(tensor.ptr(), dtensor_type_.ptr()) == 1)
    return tensor.attr("_local_tensor");
  return nb::borrow(tensor);
}

Dtype TorchTensors::dtype_of(nb::handle torch_dtype, const std::string& what) const {
  std::string names;
  for (const auto& [object, dtype] : dtypes_) {
    if (torch_dtype.is(object))
      return dtype;
    names += (names.empty() ? "" : ", ") + text(object);
  }
  throw Error(what + " has dtype " + text(torch_dtype) + ": optjit compiles " + names + " tensors");
}

Device TorchTensors::device_of(nb::handle torch_device, const std::string& what) {
  const std::string type = text(torch_device.attr("type"));
  if (type == "cpu")
    return Device::cpu();
  if (type == "cuda") {
    nb::object index = torch_device.attr("index");
    return Device::cuda(index.is_none() ? 0 : nb::cast<int>(index));
  }
  throw Error(what + " is on " + text(torch_device) + ": optjit steps tensors on the CPU and on CUDA devices");
}

uintptr_t TorchTensors::data_ptr(nb::handle tensor) { return nb::cast<uintptr_t>(tensor.attr("data_ptr")()); }

Tensor TorchTensors::view(nb::handle tensor, const std::string& what) const {
  if (!is_tensor(tensor))
    throw Error(what + " is a " + text(nb::handle(Py_TYPE(tensor.ptr()))) + ", not a torch.Tensor");
  nb::object t = local(tensor);
  if (!nb::handle(Py_TYPE(t.ptr())).attr("__torch_dispatch__").is(plain_dispatch_))
    throw Error(what + " is a " + text(nb::handle(Py_TYPE(t.ptr()))) +
                ", a tensor subclass with a dispatch of its own (__torch_dispatch__, as a quantized or float8 "
                "wrapper has): optjit steps the memory of plain tensors, nn.Parameter and DTensor, and cannot see "
                "through it");
  if (!t.attr("layout").is(strided_))
    throw Error(what + " has layout " + text(t.attr("layout")) +
                ": optjit steps dense (torch.strided) tensors, not sparse ones");
  const Device device = device_of(t.attr("device"), what);
  const Dtype dtype = dtype_of(t.attr("dtype"), what);
  Shape shape, strides;
  for (nb::handle extent : t.attr("shape"))
    shape.push_back(nb::cast<int64_t>(extent));
  for (nb::handle stride : t.attr("stride")())
    strides.push_back(nb::cast<int64_t>(stride));
  return Tensor::from_blob(reinterpret_cast<void*>(data_ptr(t)), shape, dtype, strides, device);
}

} // namespace optjit::python
