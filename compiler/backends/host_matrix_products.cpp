#include "compiler/backends/host_matrix_products.h"
#include "runtime/error.h"
#include "runtime/gemm.h"

namespace optjit {

const ListArguments& HostMatrixProducts::bind(const ListArguments& args, const KernelPlan& plan) {
  if (scratch_.empty())
    return args;
  bound_ = args;
  std::string param_slot;
  for (const Slot& s : plan.graph.slots)
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
  for (const ScratchBuffer& s : scratch_) {
    const auto [rows, cols] = matrix_dims(s.shape);
    std::vector<Tensor> tensors;
    for (const Shape& shape : shapes) {
      const auto size = [&](char dim) { return dim == 'm' ? shape[0] : shape[1]; };
      tensors.push_back(Tensor::empty({size(rows), size(cols)}, s.dtype));
    }
    bound_.slot_names.push_back(s.name);
    bound_.slot_tensors.push_back(std::move(tensors));
  }
  return bound_;
}

double HostMatrixProducts::scalar(const LibraryCall::Scalar& s, std::size_t entry) const {
  if (s.hyper.empty())
    return s.value;
  const std::size_t per_group = bound_.hyper_names.size();
  return hyper_[static_cast<std::size_t>(bound_.group_of[entry]) * per_group +
                static_cast<std::size_t>(bound_.hyper_index(s.hyper))];
}

void HostMatrixProducts::run(const std::vector<LibraryCall>& calls) const {
  for (const LibraryCall& call : calls) {
    const MatrixProductForm form = matrix_product_form(Node{call.op, Level::Element, Dtype::f32, {}, 0, call.form});
    const std::vector<Tensor>&result = buffers(call.result), &a = buffers(call.a), &b = buffers(call.b);
    for (std::size_t t = 0; t < result.size(); ++t) {
      const Shape &sa = a[t].shape(), &sb = b[t].shape();
      GemmShape shape{.m = form.transpose_a ? sa[1] : sa[0],
                      .n = form.transpose_b ? sb[0] : sb[1],
                      .k = form.transpose_a ? sa[0] : sa[1],
                      .transpose_a = form.transpose_a,
                      .transpose_b = form.transpose_b,
                      .operands = form.dtype,
                      .result = form.dtype};
      if (call.op == Op::addmm) { // torch's addmm: the input copied into the result, then the sum post-op
        result[t].copy_from(buffers(call.input)[t]);
        shape.beta = scalar(call.beta, t);
      }
      shape.alpha = scalar(call.alpha, t);
      prepared_gemm(shape).run(a[t].data(), b[t].data(), result[t].data());
    }
  }
}

} // namespace optjit
