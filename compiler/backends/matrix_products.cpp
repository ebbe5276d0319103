#include "compiler/backends/matrix_products.h"
#include "runtime/error.h"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstring>

namespace optjit {

const ListArguments& MatrixProducts::bind(const ListArguments& args, std::vector<const KernelPlan*> plans) {
  if (scratch_.empty())
    return args;
  plans_ = std::move(plans);
  bound_ = args;
  std::string param_slot;
  for (const Slot& s : plans_.front()->graph.slots)
    if (param_slot.empty() && s.kind == SlotKind::Tensor && s.role != SlotRole::Scratch)
      param_slot = s.name;
  std::vector<Shape> shapes = args.shapes;
  if (shapes.empty())
    for (const Tensor& t : args.slot(param_slot))
      shapes.push_back(t.shape());
  for (const Shape& shape : shapes)
    if (shape.size() != 2)
      throw Error("a matrix product of a param of shape " + shape_to_string(shape) +
                  ": the step multiplies each param as a matrix (rank 2)");
  // Entries of one shape and one param group run as one batched product: their buffers lie one after another.
  batches_.clear();
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    auto same = [&](const std::vector<std::size_t>& batch) {
      return shapes[batch[0]] == shapes[t] && args.group_of[batch[0]] == args.group_of[t];
    };
    if (auto it = std::find_if(batches_.begin(), batches_.end(), same); it != batches_.end())
      it->push_back(t);
    else
      batches_.push_back({t});
  }
  // One block of memory per storage and batch; each buffer of the storage views it.
  std::map<int, std::vector<Tensor>> storage_blocks;
  blocks_.clear();
  for (const ScratchBuffer& s : scratch_) {
    const auto [rows, cols] = matrix_dims(s.shape);
    std::vector<Tensor>& blocks = storage_blocks[s.storage];
    std::vector<Tensor> tensors(shapes.size());
    for (std::size_t k = 0; k < batches_.size(); ++k) {
      const std::vector<std::size_t>& batch = batches_[k];
      const Shape& shape = shapes[batch[0]];
      const auto size = [&](char dim) { return dim == 'm' ? shape[0] : shape[1]; };
      const int64_t r = size(rows), c = size(cols);
      if (blocks.size() == k)
        blocks.push_back(Tensor::empty({static_cast<int64_t>(batch.size()), r, c}, s.dtype, library_->device()));
      const Tensor& block = blocks[k];
      for (std::size_t i = 0; i < batch.size(); ++i) // each entry's matrix, a view of the block
        tensors[batch[i]] =
            Tensor::from_blob(static_cast<std::byte*>(block.data()) +
                                  static_cast<int64_t>(i) * r * c * static_cast<int64_t>(dtype_size(s.dtype)),
                              {r, c}, s.dtype, {}, library_->device());
    }
    blocks_[s.name] = blocks;
    bound_.slot_names.push_back(s.name);
    bound_.slot_tensors.push_back(std::move(tensors));
  }
  hyper_ = args.hyper;
  prepare();
  return bound_;
}

void MatrixProducts::set_hyper(const std::vector<double>& values_by_group) {
  const auto same_bits = [](double a, double b) { return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b); };
  if (scratch_.empty() || std::equal(values_by_group.begin(), values_by_group.end(), hyper_.begin(), hyper_.end(),
                                     same_bits)) // NaN: a value the kernels read on the device
    return;
  hyper_ = values_by_group;
  if (coefficients() != coefficients_) // a learning rate moves every step; the products' coefficients seldom
    prepare();
}

std::vector<double> MatrixProducts::coefficients() const {
  std::vector<double> values;
  for (const KernelPlan* plan : plans_)
    for (const LibraryCall& call : plan->calls_after)
      for (const std::vector<std::size_t>& batch : batches_)
        for (const LibraryCall::Scalar* s : {&call.beta, &call.alpha})
          values.push_back(scalar(*s, batch[0]));
  return values;
}

double MatrixProducts::scalar(const LibraryCall::Scalar& s, std::size_t entry) const {
  if (s.hyper.empty())
    return s.value;
  const std::size_t per_group = bound_.hyper_names.size();
  return hyper_[static_cast<std::size_t>(bound_.group_of[entry]) * per_group +
                static_cast<std::size_t>(bound_.hyper_index(s.hyper))];
}

// Each call's product per batch, with this step's beta and alpha (the batch's param group's): the library's kernel
// for it is chosen and compiled once per shape and coefficients (prepared_gemm), here rather than in a step.
void MatrixProducts::prepare() {
  coefficients_ = coefficients();
  prepared_.assign(plans_.size(), {});
  for (std::size_t p = 0; p < plans_.size(); ++p)
    for (const LibraryCall& call : plans_[p]->calls_after) {
      const MatrixProductForm form = matrix_product_form(Node{call.op, Level::Element, Dtype::f32, {}, 0, call.form});
      const std::vector<Tensor>&a = blocks_.at(call.a), &b = blocks_.at(call.b);
      std::vector<MatrixLibrary::Product>& per_batch = prepared_[p].emplace_back();
      for (std::size_t k = 0; k < batches_.size(); ++k) {
        GemmShape shape = gemm_shape(form, a[k].shape(), b[k].shape()); // blocks of [count, rows, cols]
        const std::size_t entry = batches_[k][0];
        if (call.op == Op::addmm)
          shape.beta = scalar(call.beta, entry);
        shape.alpha = scalar(call.alpha, entry);
        per_batch.push_back(library_->prepare(shape));
      }
    }
}

void MatrixProducts::run(std::size_t kernel) const {
  if (scratch_.empty())
    return;
  const std::vector<LibraryCall>& calls = plans_[kernel]->calls_after;
  for (std::size_t c = 0; c < calls.size(); ++c) {
    const LibraryCall& call = calls[c];
    const std::vector<Tensor>&result = blocks_.at(call.result), &a = blocks_.at(call.a), &b = blocks_.at(call.b);
    for (std::size_t k = 0; k < batches_.size(); ++k) {
      if (call.op == Op::addmm) // torch's addmm: the input copied into the result, then C = beta C + alpha A B
        library_->copy(result[k].data(), blocks_.at(call.input)[k].data(), result[k].nbytes());
      prepared_[kernel][c][k](a[k].data(), b[k].data(), result[k].data());
    }
  }
}

namespace {

class HostMatrixLibrary final : public MatrixLibrary {
public:
  Device device() const override { return Device::cpu(); }
  Product prepare(const GemmShape& shape) override {
    const Gemm* gemm = &prepared_gemm(shape); // the process's, kept for its life
    return [gemm](const void* a, const void* b, void* c) { gemm->run(a, b, c); };
  }
  void copy(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
};

} // namespace

std::unique_ptr<MatrixLibrary> host_matrix_library() { return std::make_unique<HostMatrixLibrary>(); }

} // namespace optjit
