// Tensor: a handle to shaped, typed memory (owned storage or a view of user memory) with a `grad` slot, as
// torch.Tensor. Copies of a handle share the tensor; shape, dtype and storage never change after creation, so an
// identity (uid) check proves that nothing about a tensor changed.
#pragma once

#include "runtime/device.h"
#include "runtime/dtype.h"

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace optjit {

using Shape = std::vector<int64_t>;

std::string shape_to_string(const Shape& shape);
// Row-major strides (in elements) of a contiguous tensor of `shape`.
Shape contiguous_strides(const Shape& shape);

// Increases whenever any tensor's grad slot or data changes (set_grad, set_data), anywhere in the process. A
// compiled step that reads the value it saw last time knows that no param's grad or buffer changed since, without
// visiting every param.
uint64_t tensor_slot_epoch();
int64_t shape_numel(const Shape& shape);

// The limits every tensor obeys, checked where shapes enter (Tensor::empty, Tensor::from_blob): a shape beyond them
// is an optjit::Error that names the limit, never a wrap-around. 2^48 bytes (256 TiB) is more memory than any
// machine has, and keeps every element offset and byte count far from int64 overflow.
constexpr std::size_t kMaxTensorRank = 64;
constexpr int64_t kMaxTensorBytes = int64_t{1} << 48;

class Storage;

// The shared state behind Tensor handles. Fields are read inline on the per-step guard path.
struct TensorImpl {
  std::shared_ptr<Storage> storage;
  void* data = nullptr;
  Shape shape;
  Shape strides;          // in elements
  bool contiguous = true; // strides are shape's row-major strides
  int64_t numel = 0;
  Dtype dtype = Dtype::f32;
  Device device;
  uint64_t uid = 0;       // identity of the tensor, never reused
  uint64_t layout_id = 0; // changes whenever storage, shape or dtype change (set_data); never reused
  std::shared_ptr<TensorImpl> grad;
};

class Tensor {
public:
  Tensor() = default; // undefined, like a None grad

  static Tensor empty(const Shape& shape, Dtype dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, Dtype dtype, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, Dtype dtype, Device device = Device::cpu());
  // torch's empty_like(like, dtype, memory_format=preserve_format): `like`'s shape on `device`, with `like`'s strides
  // when it is dense, row-major otherwise.
  static Tensor empty_like(const Tensor& like, Dtype dtype, Device device);
  // Values are given as doubles and rounded to `dtype`; values.size() must equal the shape's element count.
  static Tensor from_values(const Shape& shape, std::span<const double> values, Dtype dtype);
  // A view of memory the caller owns, row-major unless `strides` (in elements, one per dimension, >= 0) say
  // otherwise; the caller keeps it alive. `data` is a host address, or a device address on a CUDA `device` (such
  // as a torch CUDA tensor's data_ptr).
  static Tensor from_blob(void* data, const Shape& shape, Dtype dtype, const Shape& strides = {},
                          Device device = Device::cpu());

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  const Shape& strides() const { return impl_->strides; }
  bool is_contiguous() const { return impl_->contiguous; }
  // No two elements share an address, as a step that writes each element once needs (by the usual sufficient rule:
  // ordered by stride, each stride reaches past the span of the smaller ones). Expanded (stride 0) tensors overlap.
  bool is_non_overlapping() const;
  // The bytes from the first element's address to the end of the last (0 when empty): the memory the tensor reaches.
  std::size_t span_bytes() const;
  // Non-overlapping and dense: the elements fill exactly numel() consecutive slots from data(), in some order of the
  // dimensions (a contiguous block, or a permutation of one such as a transpose).
  bool is_dense() const;
  // Both dense with the same shape and strides (extents of 1 aside): element k of one's memory is element k of the
  // other's, so a kernel can walk the two flat, in storage order.
  bool same_dense_layout(const Tensor& other) const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t numel() const { return impl_->numel; }
  Dtype dtype() const { return impl_->dtype; }
  Device device() const { return impl_->device; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype()); }
  void* data() const { return impl_->data; }
  template <class T> T* data_as() const { return static_cast<T*>(data()); }
  // Process-unique identity of this tensor; never reused, unlike addresses.
  uint64_t uid() const { return impl_->uid; }
  // Changes whenever this tensor's storage, shape or dtype change; equal ids mean nothing about them changed.
  uint64_t layout_id() const { return impl_->layout_id; }
  // torch's `p.data = source`: this tensor now shares source's storage, shape and dtype (its grad and identity
  // stay).
  void set_data(const Tensor& source) const;
  const TensorImpl* impl() const { return impl_.get(); }

  // The grad slot (torch's .grad): undefined means None.
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;
  void reset_grad() const { set_grad(Tensor()); }

  // Elements are addressed by their row-major index, whatever the strides. On a CUDA device each access is a
  // synchronous copy (ordered after the kernels launched so far): for checks and state files, not inner loops.
  // Element `index` (in row-major order) as double; an index outside [0, numel) is an optjit::Error.
  double item(int64_t index = 0) const;
  void set_item(int64_t index, double value) const;
  std::vector<double> to_vector() const; // all elements as doubles
  Tensor clone() const;                  // a contiguous copy on the same device
  // torch's `tensor.to(device)`: this tensor when it is already there, otherwise a contiguous copy on `target`.
  Tensor to(Device target) const;
  // A copy in `target` dtype (this tensor itself when it already has it), in this tensor's layout when it is dense
  // (torch's preserve_format), contiguous otherwise: values converted through double, so narrowing rounds to nearest
  // even (to bf16 and f16 from f64 through f32, as torch does).
  Tensor to(Dtype target) const;
  void copy_from(const Tensor& source) const; // same shape and dtype required
  // torch's view_as_real: a complex tensor's memory as its component dtype, with a last dimension of 2 holding
  // (re, im). It shares (and keeps alive) the complex tensor's memory, and is a new tensor (its own uid and layout).
  // Values of a complex tensor are read and written through it: item, set_item, fill and from_values refuse complex.
  Tensor view_as_real() const;
  // view_as_real() of a complex tensor; the tensor itself otherwise. What optimizer steps run on.
  Tensor real_view() const;
  void fill(double value) const;

  bool same(const Tensor& other) const { return impl_ == other.impl_; }
  std::string describe() const; // "f32[10, 10] on cpu", strides added when not contiguous

private:
  void copy_strided(const Tensor& source) const; // copy_from between host tensors of different layouts
  void check_index(int64_t index) const;
  int64_t offset_of(int64_t index) const; // row-major index -> element offset from data()
  std::shared_ptr<TensorImpl> impl_;
};

// Calls visit(offsets) once per row of `shape` (each index of every dimension but the last, in row-major order),
// with the element offset of the row's first element under each of `strides` (one layout per tensor walked
// together); the caller walks the row by the last dimension's stride. A 0-d shape is one row; a shape with an empty
// dimension but the last has none.
template <std::size_t N, class Visit>
void for_each_row(const Shape& shape, const std::array<const Shape*, N>& strides, const Visit& visit) {
  const std::size_t outer = shape.empty() ? 0 : shape.size() - 1;
  int64_t rows = 1;
  for (std::size_t d = 0; d < outer; ++d)
    rows *= shape[d];
  std::vector<int64_t> index(outer, 0);
  std::array<int64_t, N> at{};
  for (int64_t row = 0; row < rows; ++row) {
    visit(at);
    for (std::size_t d = outer; d-- > 0;) { // the next row, the dimension before the last fastest
      for (std::size_t k = 0; k < N; ++k)
        at[k] += (*strides[k])[d];
      if (++index[d] < shape[d])
        break;
      for (std::size_t k = 0; k < N; ++k)
        at[k] -= index[d] * (*strides[k])[d];
      index[d] = 0;
    }
  }
}

} // namespace optjit
