#include "torch_tensors.h"
#include "runtime/error.h"

#include <nanobind/stl/string.h>

#include <algorithm>

namespace optjit::python {
namespace {

nb::object interned(const char* name) { return nb::steal(PyUnicode_InternFromString(name)); }

// The int elements of a tuple (torch.Size is one, and so is what stride() returns).
Shape int_tuple(nb::handle tuple, const char* what) {
  if (!PyTuple_Check(tuple.ptr()))
    throw Error(std::string(what) + " is not a tuple");
  const Py_ssize_t n = PyTuple_GET_SIZE(tuple.ptr());
  Shape values(static_cast<std::size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    values[static_cast<std::size_t>(i)] = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple.ptr(), i));
    if (values[static_cast<std::size_t>(i)] == -1 && PyErr_Occurred())
      throw nb::python_error();
  }
  return values;
}

} // namespace

TorchTensors::TorchTensors() {
  names_ = {interned("grad"),    interned("data_ptr"),   interned("shape"),         interned("stride"),
            interned("layout"),  interned("dtype"),      interned("device"),        interned("is_cpu"),
            interned("is_cuda"), interned("get_device"), interned("_local_tensor"), interned("__torch_dispatch__"),
            interned("is_neg"),  interned("is_conj"),    interned("resolve_neg"),   interned("resolve_conj")};
  nb::module_ torch = nb::module_::import_("torch");
  tensor_type_ = torch.attr("Tensor");
  strided_ = torch.attr("strided");
  plain_dispatch_ = attr(tensor_type_, names_.torch_dispatch); // torch.Tensor's and nn.Parameter's: none of their own
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

nb::object TorchTensors::attr(nb::handle object, const nb::object& name) {
  PyObject* value = PyObject_GetAttr(object.ptr(), name.ptr());
  if (!value)
    throw nb::python_error();
  return nb::steal(value);
}

nb::object TorchTensors::call(nb::handle object, const nb::object& name) {
  PyObject* value = PyObject_CallMethodNoArgs(object.ptr(), name.ptr());
  if (!value)
    throw nb::python_error();
  return nb::steal(value);
}

bool TorchTensors::is_tensor(nb::handle object) const {
  // A subclass check first (no __instancecheck__ lookup); isinstance() for anything that says otherwise.
  return PyObject_TypeCheck(object.ptr(), reinterpret_cast<PyTypeObject*>(tensor_type_.ptr())) ||
         PyObject_IsInstance(object.ptr(), tensor_type_.ptr()) == 1;
}

nb::object TorchTensors::local(nb::handle tensor) const {
  if (!dtensor_type_.is_none() &&
      PyObject_TypeCheck(tensor.ptr(), reinterpret_cast<PyTypeObject*>(dtensor_type_.ptr())))
    return attr(tensor, names_.local_tensor);
  return nb::borrow(tensor);
}

Dtype TorchTensors::dtype_of(nb::handle torch_dtype, const std::string& what, bool codes) const {
  std::string names;
  for (const auto& [object, dtype] : dtypes_) {
    if (is_code_dtype(dtype) != codes) // quantized state's codes: never a tensor optjit computes on
      continue;
    if (torch_dtype.is(object))
      return dtype;
    names += (names.empty() ? "" : ", ") + text(object);
  }
  throw Error(what + " has dtype " + text(torch_dtype) + ": optjit compiles " + names + " tensors");
}

Device TorchTensors::device_of(nb::handle tensor, const std::string& what) const {
  if (attr(tensor, names_.is_cpu).is(Py_True))
    return Device::cpu();
  if (attr(tensor, names_.is_cuda).is(Py_True))
    return Device::cuda(nb::cast<int>(call(tensor, names_.get_device)));
  throw Error(what + " is on " + text(attr(tensor, names_.device)) +
              ": optjit steps tensors on the CPU and on CUDA devices");
}

uintptr_t TorchTensors::data_ptr(nb::handle tensor) const {
  nb::object address = call(tensor, names_.data_ptr);
  const unsigned long long value = PyLong_AsUnsignedLongLong(address.ptr());
  if (value == static_cast<unsigned long long>(-1) && PyErr_Occurred())
    throw nb::python_error();
  return static_cast<uintptr_t>(value);
}

TorchTensors::LazyBits TorchTensors::lazy_bits(nb::handle tensor) const {
  nb::object t = local(tensor);
  return {call(t, names_.is_neg).is(Py_True), call(t, names_.is_conj).is(Py_True)};
}

nb::object TorchTensors::resolved(nb::handle tensor) const {
  return call(call(local(tensor), names_.resolve_conj), names_.resolve_neg); // each a copy when its bit is set
}

bool TorchTensors::still_views(nb::handle tensor, const Tensor& view) const {
  return data_ptr(local(tensor)) == reinterpret_cast<uintptr_t>(view.data());
}

bool TorchTensors::plain_dispatch(nb::handle type) const {
  if (std::any_of(plain_types_.begin(), plain_types_.end(), [&](const nb::object& t) { return t.is(type); }))
    return true;
  if (!attr(type, names_.torch_dispatch).is(plain_dispatch_))
    return false;
  if (plain_types_.size() < 16) // a few types in any program: Tensor, Parameter, a Buffer or two
    plain_types_.push_back(nb::borrow(type));
  return true;
}

Tensor TorchTensors::codes_view(nb::handle held, const std::string& what) const {
  if (!is_tensor(held))
    throw Error(what + " is a " + text(nb::handle(Py_TYPE(held.ptr()))) + ", not a torch.Tensor");
  const nb::object tensor = local(held); // a DTensor's codes: this process's shard
  if (nb::object layout = attr(tensor, names_.layout); !layout.is(strided_))
    throw Error(what + " has layout " + text(layout) + ": codes are dense (torch.strided) tensors");
  const Device device = device_of(tensor, what);
  const Dtype dtype = dtype_of(attr(tensor, names_.dtype), what, /*codes=*/true);
  const Shape shape = int_tuple(attr(tensor, names_.shape), "Tensor.shape");
  const Shape strides = int_tuple(call(tensor, names_.stride), "Tensor.stride()");
  return Tensor::from_blob(reinterpret_cast<void*>(data_ptr(tensor)), shape, dtype, strides, device);
}

bool TorchTensors::holds_codes(nb::handle tensor) const {
  const nb::object dtype = attr(tensor, names_.dtype);
  return std::any_of(dtypes_.begin(), dtypes_.end(),
                     [&](const auto& entry) { return is_code_dtype(entry.second) && dtype.is(entry.first); });
}

Tensor TorchTensors::view(nb::handle tensor, const std::string& what, LazyBits bits) const {
  if (!is_tensor(tensor))
    throw Error(what + " is a " + text(nb::handle(Py_TYPE(tensor.ptr()))) + ", not a torch.Tensor");
  nb::object t = local(tensor);
  if (!plain_dispatch(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(t.ptr())))))
    throw Error(what + " is a " + text(nb::handle(Py_TYPE(t.ptr()))) +
                ", a tensor subclass with a dispatch of its own (__torch_dispatch__, as a quantized or float8 "
                "wrapper has): optjit steps the memory of plain tensors, nn.Parameter and DTensor, and cannot see "
                "through it");
  if (bits.any())
    throw Error(what + " has torch's lazy " + (bits.negated ? "negation" : "conjugation") +
                " bit set (torch._neg_view, .conj(), .conj().imag): its memory holds the " +
                (bits.negated ? "negated" : "conjugated") +
                " values; resolve it first (.resolve_neg(), .resolve_conj())");
  if (nb::object layout = attr(t, names_.layout); !layout.is(strided_))
    throw Error(what + " has layout " + text(layout) + ": optjit steps dense (torch.strided) tensors, not sparse ones");
  const Device device = device_of(t, what);
  const Dtype dtype = dtype_of(attr(t, names_.dtype), what);
  const Shape shape = int_tuple(attr(t, names_.shape), "Tensor.shape");
  const Shape strides = int_tuple(call(t, names_.stride), "Tensor.stride()");
  return Tensor::from_blob(reinterpret_cast<void*>(data_ptr(t)), shape, dtype, strides, device);
}

} // namespace optjit::python
