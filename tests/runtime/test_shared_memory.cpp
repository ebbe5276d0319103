// first_shared_memory: tensors that hold a byte in common, found exactly (views interleaved in one buffer share an
// address range and no element), in one pass over the tensors whose ranges overlap.
#include "runtime/shared_memory.h"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <vector>

using namespace optjit;

namespace {

using Pair = std::optional<std::pair<std::size_t, std::size_t>>;

Tensor view(std::vector<float>& buffer, std::size_t offset, const Shape& shape, const Shape& strides) {
  return Tensor::from_blob(buffer.data() + offset, shape, Dtype::f32, strides);
}

} // namespace

TEST_CASE("shared memory: interleaved views share nothing, overlapping ones are named, empty ones hold nothing") {
  std::vector<float> buffer(6 * 8, 0.0f);
  const Tensor even = view(buffer, 0, {6, 4}, {8, 2}), odd = view(buffer, 1, {6, 4}, {8, 2});
  const Tensor column = view(buffer, 0, {6}, {8}), row = view(buffer, 8, {8}, {1});
  const Tensor separate = Tensor::zeros({6, 4}, Dtype::f32);
  CHECK(first_shared_memory({even, odd, separate}) == Pair{});
  CHECK(first_shared_memory({even, odd, column}) == Pair{{0, 2}}); // column 0 is even's
  const Pair with_row = first_shared_memory({row, odd, even});     // row 1 holds odd and even elements: either is named
  REQUIRE(with_row);
  CHECK(with_row->first == 0);
  CHECK(first_shared_memory({even, even}) == Pair{{0, 1}});
  CHECK(first_shared_memory({Tensor(), view(buffer, 3, {0}, {1}), even}) == Pair{});
  // A bf16 view of the upper half of an f32 element shares that element; of another element's, not.
  std::vector<float> words(4, 0.0f);
  const Tensor f32 = view(words, 0, {2}, {2});
  const auto halves = [&](std::size_t word) {
    return Tensor::from_blob(reinterpret_cast<uint16_t*>(words.data()) + 2 * word + 1, {1}, Dtype::bf16, {1});
  };
  CHECK(first_shared_memory({f32, halves(1)}) == Pair{});
  CHECK(first_shared_memory({f32, halves(2)}) == Pair{{0, 1}});
}

TEST_CASE("shared memory: the columns of one buffer, each a param, are one pass over the buffer") {
  // 400 column views of a 400 x 400 buffer: every pair's ranges overlap, so comparing pairs would take 80,000 passes.
  std::vector<float> buffer(400 * 400, 0.0f);
  std::vector<Tensor> columns;
  for (std::size_t c = 0; c < 400; ++c)
    columns.push_back(view(buffer, c, {400}, {400}));
  const auto start = std::chrono::steady_clock::now();
  CHECK(first_shared_memory(columns) == Pair{});
  columns.push_back(view(buffer, 401, {3}, {1})); // row 1, columns 1..3
  CHECK(first_shared_memory(columns) == Pair{{1, 400}});
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5)); // about 10 ms; pairwise: minutes
}
