#include "runtime/tensor.h"
#include "runtime/allocator.h"
#include "runtime/cuda/cuda_driver.h"
#include "runtime/error.h"

#include <algorithm>
#include <atomic>
#include <cstring>

namespace optjit {

class Storage {
public:
  Storage(std::size_t bytes, Device device) : bytes_(bytes), device_(device), owned_(true) {
    if (device.kind == DeviceKind::cuda)
      data_ = reinterpret_cast<void*>(device_allocate(device.index, bytes));
    else
      data_ = host_allocate(bytes);
  }
  Storage(void* user_data, std::size_t bytes) : data_(user_data), bytes_(bytes) {}
  ~Storage() {
    if (!owned_)
      return;
    if (device_.kind == DeviceKind::cuda)
      device_release(device_.index, reinterpret_cast<uint64_t>(data_), bytes_);
    else
      host_release(data_, bytes_);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }

private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_;
  bool owned_ = false;
};

namespace {

uint64_t next_uid() {
  static std::atomic<uint64_t> counter{1};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

std::atomic<uint64_t> slot_epoch{0};

void bump_slot_epoch() { slot_epoch.fetch_add(1, std::memory_order_relaxed); }

uint64_t device_address(const Tensor& t, int64_t element = 0) {
  return reinterpret_cast<uint64_t>(t.data()) + static_cast<uint64_t>(element) * dtype_size(t.dtype());
}

bool on_cuda(const Tensor& t) { return t.device().kind == DeviceKind::cuda; }

// Extents >= 0, at most kMaxTensorRank of them, and at most kMaxTensorBytes of `dtype` in all, counted without
// overflow. A shape with a zero extent has no elements, but its other extents still make its strides: they too must
// fit (a [0, 2^62, 2^62] tensor's strides would overflow).
void check_shape(const Shape& shape, Dtype dtype) {
  if (shape.size() > kMaxTensorRank)
    throw Error("invalid shape with " + std::to_string(shape.size()) + " dimensions: a tensor has at most " +
                std::to_string(kMaxTensorRank) + " (kMaxTensorRank)");
  for (int64_t extent : shape)
    if (extent < 0)
      throw Error("invalid shape " + shape_to_string(shape) + ": extents must be >= 0");
  const bool empty = std::find(shape.begin(), shape.end(), 0) != shape.end();
  int64_t bytes = static_cast<int64_t>(dtype_size(dtype));
  for (int64_t extent : shape)
    if (__builtin_mul_overflow(bytes, std::max<int64_t>(extent, 1), &bytes) || bytes > kMaxTensorBytes)
      throw Error("invalid shape " + shape_to_string(shape) + " of " + std::string(dtype_name(dtype)) +
                  (empty ? ": its extents other than 0 span more than the largest tensor, 2^48 bytes (kMaxTensorBytes)"
                         : ": more than the largest tensor, 2^48 bytes (kMaxTensorBytes)"));
}

// The (stride, extent) of each dimension that has more than one element, by increasing stride.
std::vector<std::pair<int64_t, int64_t>> strided_dims(const TensorImpl& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (std::size_t d = 0; d < t.shape.size(); ++d)
    if (t.shape[d] > 1)
      dims.emplace_back(t.strides[d], t.shape[d]);
  std::sort(dims.begin(), dims.end());
  return dims;
}

} // namespace

std::string shape_to_string(const Shape& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i)
    text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= shape[d];
  }
  return strides;
}

int64_t shape_numel(const Shape& shape) {
  int64_t numel = 1;
  for (int64_t extent : shape)
    numel *= extent;
  return numel;
}

Tensor Tensor::empty(const Shape& shape, Dtype dtype, Device device) {
  check_shape(shape, dtype);
  Tensor t;
  t.impl_ = std::make_shared<TensorImpl>();
  t.impl_->shape = shape;
  t.impl_->strides = contiguous_strides(shape);
  t.impl_->numel = shape_numel(shape);
  t.impl_->dtype = dtype;
  t.impl_->uid = next_uid();
  t.impl_->layout_id = next_uid();
  t.impl_->device = device;
  t.impl_->storage = std::make_shared<Storage>(static_cast<std::size_t>(t.impl_->numel) * dtype_size(dtype), device);
  t.impl_->data = t.impl_->storage->data();
  return t;
}

Tensor Tensor::zeros(const Shape& shape, Dtype dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (on_cuda(t))
    cuda::memset_zero(device.index, device_address(t), t.nbytes());
  else
    std::memset(t.data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, Dtype dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill(value);
  return t;
}

Tensor Tensor::empty_like(const Tensor& like, Dtype dtype, Device device) {
  Tensor t = empty(like.shape(), dtype, device);
  if (!like.is_contiguous() && like.is_dense()) { // the same number of elements, walked in like's order
    t.impl_->strides = like.strides();
    t.impl_->contiguous = false;
  }
  return t;
}

std::size_t Tensor::span_bytes() const {
  if (numel() == 0)
    return 0;
  int64_t last = 0;
  for (std::size_t d = 0; d < shape().size(); ++d)
    last += (shape()[d] - 1) * strides()[d];
  return static_cast<std::size_t>(last + 1) * dtype_size(dtype());
}

bool Tensor::is_non_overlapping() const {
  if (is_contiguous() || numel() == 0)
    return true;
  int64_t span = 0; // the largest offset the dimensions of smaller strides reach
  for (const auto& [stride, extent] : strided_dims(*impl_)) {
    if (stride <= span)
      return false;
    span += stride * (extent - 1);
  }
  return true;
}

bool Tensor::is_dense() const {
  if (is_contiguous() || numel() == 0)
    return true;
  int64_t expected = 1;
  for (const auto& [stride, extent] : strided_dims(*impl_)) {
    if (stride != expected)
      return false;
    expected *= extent;
  }
  return true;
}

bool Tensor::same_dense_layout(const Tensor& other) const {
  if (shape() != other.shape() || !is_dense() || !other.is_dense())
    return false;
  for (std::size_t d = 0; d < shape().size(); ++d)
    if (shape()[d] > 1 && strides()[d] != other.strides()[d])
      return false;
  return true;
}

Tensor Tensor::from_values(const Shape& shape, std::span<const double> values, Dtype dtype) {
  check_shape(shape, dtype); // before the count: a shape that does not fit has no element count
  if (static_cast<int64_t>(values.size()) != shape_numel(shape)) // before allocating the size a shape claims
    throw Error("tensor of shape " + shape_to_string(shape) + " needs " + std::to_string(shape_numel(shape)) +
                " values, got " + std::to_string(values.size()));
  Tensor t = empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.set_item(i, values[static_cast<std::size_t>(i)]);
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, Dtype dtype, const Shape& strides, Device device) {
  check_shape(shape, dtype);
  const Shape row_major = contiguous_strides(shape);
  if (!strides.empty() && strides.size() != shape.size())
    throw Error("strides " + shape_to_string(strides) + " do not fit shape " + shape_to_string(shape) +
                ": give one stride per dimension");
  for (int64_t stride : strides)
    if (stride < 0)
      throw Error("invalid strides " + shape_to_string(strides) + ": strides must be >= 0");
  Tensor t;
  t.impl_ = std::make_shared<TensorImpl>();
  t.impl_->shape = shape;
  t.impl_->strides = strides.empty() ? row_major : strides;
  t.impl_->numel = shape_numel(shape);
  // Extents of 1 (and empty tensors) make any stride contiguous, as in torch.
  t.impl_->contiguous = true;
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1 && t.impl_->strides[d] != row_major[d] && t.impl_->numel != 0)
      t.impl_->contiguous = false;
  t.impl_->dtype = dtype;
  t.impl_->uid = next_uid();
  t.impl_->layout_id = next_uid();
  int64_t span = t.impl_->numel == 0 ? 0 : 1;
  for (std::size_t d = 0; d < shape.size() && span; ++d) {
    int64_t reach = 0;
    if (__builtin_mul_overflow(shape[d] - 1, t.impl_->strides[d], &reach) ||
        __builtin_add_overflow(span, reach, &span) || span > kMaxTensorBytes / static_cast<int64_t>(dtype_size(dtype)))
      throw Error("strides " + shape_to_string(t.impl_->strides) + " of shape " + shape_to_string(shape) +
                  " reach past the largest tensor, 2^48 bytes (kMaxTensorBytes)");
  }
  t.impl_->storage = std::make_shared<Storage>(data, static_cast<std::size_t>(span) * dtype_size(dtype));
  t.impl_->data = data;
  t.impl_->device = device;
  return t;
}

Tensor Tensor::view_as_real() const {
  if (!is_complex(dtype()))
    throw Error(describe() + " is not complex: view_as_real takes a complex tensor");
  Tensor t;
  t.impl_ = std::make_shared<TensorImpl>();
  t.impl_->storage = impl_->storage; // the view keeps the complex tensor's memory alive
  t.impl_->data = impl_->data;
  t.impl_->shape = impl_->shape;
  t.impl_->shape.push_back(2);
  for (int64_t stride : impl_->strides)
    t.impl_->strides.push_back(stride * 2);
  t.impl_->strides.push_back(1);
  t.impl_->contiguous = impl_->contiguous;
  t.impl_->numel = impl_->numel * 2;
  t.impl_->dtype = component_dtype(dtype());
  t.impl_->device = impl_->device;
  t.impl_->uid = next_uid();
  t.impl_->layout_id = next_uid();
  return t;
}

Tensor Tensor::real_view() const { return is_complex(dtype()) ? view_as_real() : *this; }

void Tensor::set_data(const Tensor& source) const {
  if (source.impl_ == impl_)
    return;
  impl_->storage = source.impl_->storage;
  impl_->data = source.impl_->data;
  impl_->shape = source.impl_->shape;
  impl_->strides = source.impl_->strides;
  impl_->contiguous = source.impl_->contiguous;
  impl_->numel = source.impl_->numel;
  impl_->dtype = source.impl_->dtype;
  impl_->device = source.impl_->device;
  impl_->layout_id = next_uid();
  bump_slot_epoch();
}

Tensor Tensor::grad() const {
  Tensor g;
  g.impl_ = impl_->grad;
  return g;
}

void Tensor::set_grad(const Tensor& grad) const {
  impl_->grad = grad.impl_;
  bump_slot_epoch();
}

uint64_t tensor_slot_epoch() { return slot_epoch.load(std::memory_order_relaxed); }

int64_t Tensor::offset_of(int64_t index) const {
  if (impl_->contiguous)
    return index;
  int64_t offset = 0;
  for (std::size_t d = impl_->shape.size(); d-- > 0;) {
    offset += (index % impl_->shape[d]) * impl_->strides[d];
    index /= impl_->shape[d];
  }
  return offset;
}

void Tensor::check_index(int64_t index) const {
  if (index < 0 || index >= numel())
    throw Error("index " + std::to_string(index) + " is out of range for " + describe() + " (" +
                std::to_string(numel()) + " elements)");
}

double Tensor::item(int64_t index) const {
  check_index(index);
  return visit_real_dtype(dtype(), "item()", [&]<class T>() {
    if (on_cuda(*this)) {
      T value{};
      cuda::copy_to_host(device().index, &value, device_address(*this, index), sizeof(T));
      return static_cast<double>(value);
    }
    return static_cast<double>(data_as<T>()[offset_of(index)]);
  });
}

void Tensor::set_item(int64_t index, double value) const {
  check_index(index);
  visit_real_dtype(dtype(), "set_item()", [&]<class T>() {
    const T stored = static_cast<T>(value);
    if (on_cuda(*this))
      cuda::copy_to_device(device().index, device_address(*this, index), &stored, sizeof(T));
    else
      data_as<T>()[offset_of(index)] = stored;
  });
}

std::vector<double> Tensor::to_vector() const {
  if (on_cuda(*this))
    return to(Device::cpu()).to_vector();
  std::vector<double> values(static_cast<std::size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i)
    values[static_cast<std::size_t>(i)] = item(i);
  return values;
}

Tensor Tensor::to(Device target) const {
  if (target == device())
    return *this;
  Tensor copy = empty(shape(), dtype(), target);
  copy.copy_from(*this);
  return copy;
}

Tensor Tensor::clone() const {
  Tensor copy = empty(shape(), dtype(), device());
  copy.copy_from(*this);
  return copy;
}

Tensor Tensor::to(Dtype target) const {
  if (target == dtype())
    return *this;
  if (on_cuda(*this))
    return to(Device::cpu()).to(target).to(device());
  if (is_complex(dtype()) || is_complex(target)) {
    if (!is_complex(dtype()) || !is_complex(target))
      throw Error("cannot convert " + describe() + " to " + std::string(dtype_name(target)) +
                  ": complex tensors convert only to complex dtypes");
    Tensor copy = empty_like(*this, target, Device::cpu());
    copy.view_as_real().copy_from(view_as_real().to(component_dtype(target))); // component by component
    return copy;
  }
  // A dense tensor keeps its layout (torch's preserve_format) and converts in memory order; others become contiguous.
  Tensor copy = empty_like(*this, target, Device::cpu());
  if (!is_dense()) {
    for (int64_t i = 0; i < numel(); ++i)
      copy.set_item(i, item(i));
    return copy;
  }
  visit_real_dtype(dtype(), "to()", [&]<class From>() {
    visit_real_dtype(target, "to()", [&]<class To>() {
      const From* from = data_as<From>();
      To* to = copy.data_as<To>();
      for (int64_t i = 0; i < numel(); ++i)
        to[i] = static_cast<To>(static_cast<double>(from[i]));
    });
  });
  return copy;
}

void Tensor::copy_from(const Tensor& source) const {
  if (source.shape() != shape() || source.dtype() != dtype())
    throw Error("cannot copy " + source.describe() + " into " + describe() + ": shape and dtype must match");
  if (source.data() == data() && source.strides() == strides() && source.device() == device())
    return; // itself
  if (numel() == 0)
    return;
  if (on_cuda(*this) || on_cuda(source)) {
    // Copies between the host and a device move contiguous bytes. A strided device tensor (a view of torch's)
    // goes through the host: its whole span of memory comes over, the elements are copied there, and a destination's
    // span goes back (elements between its own keep their values).
    if (!source.is_contiguous()) {
      if (!on_cuda(source))
        return copy_from(source.clone());
      std::vector<unsigned char> span(source.span_bytes());
      cuda::copy_to_host(source.device().index, span.data(), device_address(source), span.size());
      return copy_from(from_blob(span.data(), source.shape(), source.dtype(), source.strides()));
    }
    if (!is_contiguous()) {
      if (!on_cuda(*this))
        return copy_from(source.to(Device::cpu()));
      std::vector<unsigned char> span(span_bytes());
      cuda::copy_to_host(device().index, span.data(), device_address(*this), span.size());
      from_blob(span.data(), shape(), dtype(), strides()).copy_from(source);
      cuda::copy_to_device(device().index, device_address(*this), span.data(), span.size());
      return;
    }
    if (on_cuda(*this) && on_cuda(source) && device() == source.device())
      cuda::copy_on_device(device().index, device_address(*this), device_address(source), nbytes());
    else if (on_cuda(*this) && on_cuda(source))
      copy_from(source.to(Device::cpu()));
    else if (on_cuda(*this))
      cuda::copy_to_device(device().index, device_address(*this), source.data(), nbytes());
    else
      cuda::copy_to_host(source.device().index, data(), device_address(source), nbytes());
    return;
  }
  if (same_dense_layout(source)) { // contiguous, or the same permutation of a dense block: memory order matches
    std::memcpy(data(), source.data(), nbytes());
    return;
  }
  copy_strided(source);
}

// Element by element in both layouts (the same dtype and shape): row by row (for_each_row) and a tight loop over
// each row, each element moved as its bytes (a fixed-size memcpy: one load and one store). A staged param
// with gaps is copied in and out at memory speed, not through item() and set_item().
void Tensor::copy_strided(const Tensor& source) const {
  const Shape& sizes = shape();
  const std::size_t last = sizes.size() - 1; // numel() > 0 and the layouts differ: rank >= 1
  const auto element = static_cast<int64_t>(dtype_size(dtype()));
  auto* to = static_cast<unsigned char*>(data());
  const auto* from = static_cast<const unsigned char*>(source.data());
  const int64_t n = sizes[last], to_step = strides()[last] * element, from_step = source.strides()[last] * element;
  const auto rows = [&]<std::size_t Size>() {
    for_each_row<2>(sizes, {&strides(), &source.strides()}, [&](const std::array<int64_t, 2>& at) {
      unsigned char* to_row = to + at[0] * element;
      const unsigned char* from_row = from + at[1] * element;
      for (int64_t j = 0; j < n; ++j)
        std::memcpy(to_row + j * to_step, from_row + j * from_step, Size);
    });
  };
  switch (element) {
  case 2:
    return rows.operator()<2>();
  case 4:
    return rows.operator()<4>();
  case 8:
    return rows.operator()<8>();
  case 16:
    return rows.operator()<16>();
  default:
    OPTJIT_ASSERT(false, "an element of " + std::to_string(element) + " bytes");
  }
}

void Tensor::fill(double value) const {
  if (on_cuda(*this)) {
    Tensor staged = empty(shape(), dtype());
    staged.fill(value);
    copy_from(staged);
    return;
  }
  for (int64_t i = 0; i < numel(); ++i)
    set_item(i, value);
}

std::string Tensor::describe() const {
  if (!defined())
    return "None";
  std::string text = std::string(dtype_name(dtype())) + shape_to_string(shape());
  if (!is_contiguous())
    text += " (strides " + shape_to_string(strides()) + ")";
  return text + " on " + device().to_string();
}

} // namespace optjit
