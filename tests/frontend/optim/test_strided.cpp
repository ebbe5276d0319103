// Strided params: transposed views and slices step in every mode exactly as contiguous copies of them do. Params
// whose grad and state share their dense layout (a transpose, torch's usual case) run in place; other layouts (a
// grad in another layout, a slice with gaps) are staged through contiguous copies. Shapes from the seed's Shampoo
// test: .t() of [512, 128] slices of one buffer.
#include "helpers.h"

#include <doctest/doctest.h>

using namespace optjit;
using optjit::test::check_same_trajectory;
using optjit::test::every_optimizer;
using optjit::test::Mode;
using optjit::test::Run;

namespace {

enum class GradLayout { LikeParam, Contiguous };

// `count` params, each the transpose of a [rows, cols] slice of one buffer: shape [cols, rows], strides [1, cols].
std::vector<Tensor> transposed_slices(const Tensor& buffer, int count, int64_t rows, int64_t cols) {
  std::vector<Tensor> params;
  for (int i = 0; i < count; ++i) {
    auto* base = static_cast<char*>(buffer.data()) + i * rows * cols * static_cast<int64_t>(dtype_size(buffer.dtype()));
    params.push_back(Tensor::from_blob(base, {cols, rows}, buffer.dtype(), {1, cols}));
  }
  return params;
}

// A tensor with `like`'s shape, dtype and layout (dense ones keep their strides), holding `like`'s values.
Tensor copy_in_layout(const Tensor& like, const Tensor& values) {
  Tensor t = Tensor::empty_like(like, like.dtype(), like.device());
  t.copy_from(values);
  return t;
}

// Contiguous params holding the same values as `strided`.
std::vector<Tensor> contiguous_copies(const std::vector<Tensor>& strided) {
  std::vector<Tensor> copies;
  for (const Tensor& p : strided)
    copies.push_back(p.clone());
  return copies;
}

// The same random grads on both runs: in the strided run in `layout`, in the contiguous run contiguous.
void set_grads(std::vector<Tensor>& strided, std::vector<Tensor>& contiguous, int step, GradLayout layout) {
  for (Tensor& p : contiguous)
    p.set_grad(Tensor::zeros(p.shape(), p.dtype()));
  randomize_grads(contiguous, 70 + static_cast<uint64_t>(step));
  for (std::size_t i = 0; i < strided.size(); ++i) {
    const Tensor& g = contiguous[i].grad();
    strided[i].set_grad(layout == GradLayout::LikeParam ? copy_in_layout(strided[i], g) : g.clone());
  }
}

// `name` over `strided` params against the same optimizer over contiguous copies: bit for bit the same params and
// state after every step; returns how many params the strided run's last binding staged.
int64_t check_steps_like_contiguous(const std::string& name, const KeywordOptions& options,
                                    const std::vector<Tensor>& strided_params, Mode mode, GradLayout layout) {
  Run strided(name, options, mode, strided_params), contiguous(name, options, mode, contiguous_copies(strided_params));
  for (int step = 0; step < 4; ++step) {
    set_grads(strided.params, contiguous.params, step, layout);
    strided.step();
    contiguous.step();
    check_same_trajectory(strided.params, *strided.opt, contiguous.params, *contiguous.opt, 0, 0, "strided");
  }
  for (const Tensor& p : strided.params) // state made like its param (torch's preserve_format)
    for (const auto& [key, t] : strided.opt->visible_state(p))
      if (t.dim() > 0 && p.is_dense())
        CHECK(t.same_dense_layout(p));
  if (strided.compiled)
    CHECK(strided.compiled->metrics().compiles == 1);
  const StepMetrics* driver = strided.compiled ? &strided.compiled->metrics() : strided.opt->eager_metrics();
  return driver ? driver->staged_params : 0; // the forloop reference has no driver: it copies by itself
}

} // namespace

TEST_CASE("strided params: transposed slices step like contiguous copies, in place or staged, in every mode") {
  for (const auto& [name, options] : every_optimizer())
    for (Mode mode : {Mode::Forloop, Mode::Eager, Mode::Compiled})
      for (GradLayout layout : {GradLayout::LikeParam, GradLayout::Contiguous})
        for (Dtype dtype : {Dtype::f32, Dtype::bf16, Dtype::c64}) {
          INFO(name << " mode " << static_cast<int>(mode) << " grads " << static_cast<int>(layout) << " "
                    << dtype_name(dtype));
          Tensor buffer = Tensor::zeros({3 * 24 * 8}, dtype);
          std::vector<Tensor> params = transposed_slices(buffer, 3, 24, 8);
          for (Tensor& p : params)
            p.copy_from(random_params({p.shape()}, dtype, 5)[0]);
          const int64_t staged = check_steps_like_contiguous(name, options, params, mode, layout);
          if (mode != Mode::Forloop) // the forloop reference copies by itself
            CHECK(staged == (layout == GradLayout::Contiguous ? static_cast<int64_t>(params.size()) : 0));
        }
}

TEST_CASE("strided params: slices with gaps are staged, and the Shampoo shapes step in place") {
  // Every other column of a [6, 10] buffer: shape [6, 5], strides [10, 2], not dense.
  Tensor buffer = Tensor::zeros({6, 10}, Dtype::f32);
  Tensor gappy = Tensor::from_blob(buffer.data(), {6, 5}, Dtype::f32, {10, 2});
  gappy.copy_from(random_params({{6, 5}}, Dtype::f32, 9)[0]);
  CHECK_FALSE(gappy.is_dense());
  for (Mode mode : {Mode::Forloop, Mode::Eager, Mode::Compiled})
    for (const auto& [name, options] : every_optimizer()) {
      INFO(name << " mode " << static_cast<int>(mode));
      const std::vector<double> before = buffer.to_vector();
      const int64_t staged = check_steps_like_contiguous(name, options, {gappy}, mode, GradLayout::Contiguous);
      CHECK(staged == (mode != Mode::Forloop ? 1 : 0));
      const std::vector<double> after = buffer.to_vector();
      for (std::size_t i = 1; i < after.size(); i += 2) // the gaps are never written
        CHECK(after[i] == before[i]);
      gappy.copy_from(random_params({{6, 5}}, Dtype::f32, 9)[0]);
    }

  Tensor shampoo = Tensor::zeros({4 * 512 * 128}, Dtype::f32);
  std::vector<Tensor> params = transposed_slices(shampoo, 4, 512, 128);
  for (Tensor& p : params)
    p.copy_from(random_params({p.shape()}, Dtype::f32, 2)[0]);
  CHECK(check_steps_like_contiguous("adamw", {{"lr", {0.01}}, {"weight_decay", {0.1}}}, params, Mode::Compiled,
                                    GradLayout::LikeParam) == 0);
}

TEST_CASE("strided params: an expanded grad (stride 0) steps as its contiguous copy does, in every mode") {
  for (const auto& [name, options] : every_optimizer())
    for (Mode mode : {Mode::Forloop, Mode::Eager, Mode::Compiled})
      for (Dtype dtype : {Dtype::f32, Dtype::bf16}) {
        INFO(name << " mode " << static_cast<int>(mode) << " " << dtype_name(dtype));
        const std::vector<Tensor> initial = random_params({{6, 5}, {4}}, dtype, 8);
        Run expanded(name, options, initial, mode), contiguous(name, options, initial, mode);
        std::vector<Tensor> rows; // the memory the expanded grads view
        for (int step = 0; step < 3; ++step) {
          rows = random_params({{5}, {1}}, dtype, 90 + static_cast<uint64_t>(step));
          for (std::size_t i = 0; i < initial.size(); ++i) {
            const Shape& shape = initial[i].shape();
            const Shape strides = shape.size() == 2 ? Shape{0, 1} : Shape{0};
            const Tensor grad = Tensor::from_blob(rows[i].data(), shape, dtype, strides); // every row the same
            expanded.params[i].set_grad(grad);
            contiguous.params[i].set_grad(grad.clone());
          }
          expanded.step();
          contiguous.step();
          check_same_trajectory(expanded.params, *expanded.opt, contiguous.params, *contiguous.opt, 0, 0, "expanded");
        }
      }
}
