#include "tools/traffic_probe.h"
#include "compiler/binding.h"
#include "runtime/error.h"
#include "runtime/thread_pool.h"

#include <array>
#include <numeric>

namespace optjit {
namespace {

// One work item: out[i] = param - grad, state[i] += grad, for S state arrays; every array read once, all but the
// grad written once.
template <int S> void probe_item(const std::vector<Tensor>& arrays, int64_t begin, int64_t end) {
  float* __restrict p = arrays[0].data_as<float>();
  const float* __restrict g = arrays[S + 1].data_as<float>();
  std::array<float*, S> state{};
  for (int s = 0; s < S; ++s)
    state[static_cast<std::size_t>(s)] = arrays[static_cast<std::size_t>(s + 1)].data_as<float>();
  for (int64_t i = begin; i < end; ++i) {
    const float gi = g[i];
    for (int s = 0; s < S; ++s)
      state[static_cast<std::size_t>(s)][i] += gi;
    p[i] -= gi;
  }
}

} // namespace

TrafficProbe::TrafficProbe(const std::vector<int64_t>& numels, int reads, int writes) : state_arrays_(writes - 1) {
  if (reads != writes + 1 || writes < 1 || writes > 4)
    throw Error("the traffic probe models steps that read S + 2 arrays and write S + 1 (S from 0 to 3), not " +
                std::to_string(reads) + " reads and " + std::to_string(writes) + " writes");
  for (int64_t n : numels) {
    std::vector<Tensor> arrays;
    arrays.push_back(Tensor::full({n}, 1, Dtype::f32));
    for (int s = 0; s < state_arrays_; ++s)
      arrays.push_back(Tensor::zeros({n}, Dtype::f32));
    arrays.push_back(Tensor::full({n}, 1e-3, Dtype::f32));
    tensors_.push_back(std::move(arrays));
    bytes_ += 4 * (reads + writes) * n;
  }
  // The compiled kernels' work items and task size (their default launch shape).
  items_ = make_work_items(numels, LaunchShape{});
  grain_ = items_per_task(items_, LaunchShape{});
}

TrafficProbe::TrafficProbe(const std::vector<int64_t>& numels, const std::vector<Array>& arrays) : mixed_(arrays) {
  for (const Array& a : arrays)
    if ((a.bytes != 1 && a.bytes != 2 && a.bytes != 4 && a.bytes != 8) || !(a.read || a.written) || a.per < 1)
      throw Error("the mixed traffic probe takes arrays of 1, 2, 4 or 8 bytes that are read or written, an entry "
                  "per one or more elements");
  for (int64_t n : numels) {
    std::vector<Tensor> buffers;
    for (const Array& a : arrays) {
      buffers.push_back(Tensor::zeros({a.entries(n)}, a.bytes == 1   ? Dtype::u8
                                                      : a.bytes == 2 ? Dtype::bf16
                                                      : a.bytes == 4 ? Dtype::f32
                                                                     : Dtype::f64));
      bytes_ += a.traffic(n);
    }
    tensors_.push_back(std::move(buffers));
  }
  // Items of whole entries, as Binding cuts a quantized kernel's items at whole blocks: no entry is in two items.
  int64_t alignment = 1;
  for (const Array& a : arrays)
    alignment = std::lcm(alignment, a.per);
  const LaunchShape shape = with_whole_blocks(LaunchShape{}, alignment);
  items_ = make_work_items(numels, shape);
  grain_ = items_per_task(items_, shape);
}

namespace {

// One array over [begin, end): summed (read), incremented (read and written) or filled (written).
template <class Word> uint64_t stream(Word* data, int64_t begin, int64_t end, bool read, bool written) {
  Word sum = 0;
  if (read && written)
    for (int64_t i = begin; i < end; ++i)
      data[i] = static_cast<Word>(data[i] + 1);
  else if (read)
    for (int64_t i = begin; i < end; ++i)
      sum = static_cast<Word>(sum + data[i]);
  else
    for (int64_t i = begin; i < end; ++i)
      data[i] = static_cast<Word>(i);
  return static_cast<uint64_t>(sum);
}

} // namespace

void TrafficProbe::run_mixed(const std::vector<Tensor>& arrays, int64_t begin, int64_t end) const {
  uint64_t sink = 0;
  for (std::size_t a = 0; a < mixed_.size(); ++a) {
    const Array& array = mixed_[a];
    // The entries of elements [begin, end): work items are cut at whole blocks where entries are shared.
    const int64_t from = begin / array.per, to = (end + array.per - 1) / array.per;
    if (array.bytes == 1)
      sink += stream(static_cast<uint8_t*>(arrays[a].data()), from, to, array.read, array.written);
    else if (array.bytes == 2)
      sink += stream(arrays[a].data_as<uint16_t>(), from, to, array.read, array.written);
    else if (array.bytes == 4)
      sink += stream(arrays[a].data_as<uint32_t>(), from, to, array.read, array.written);
    else
      sink += stream(arrays[a].data_as<uint64_t>(), from, to, array.read, array.written);
  }
  volatile uint64_t keep = sink; // the sums are used, so the reads stay
  (void)keep;
}

void TrafficProbe::run() {
  if (!mixed_.empty()) {
    ThreadPool::global().parallel_for(static_cast<int64_t>(items_.size()), grain_, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        const WorkItem& item = items_[static_cast<std::size_t>(k)];
        run_mixed(tensors_[static_cast<std::size_t>(item.tensor)], item.begin, item.end);
      }
    });
    return;
  }
  ThreadPool::global().parallel_for(static_cast<int64_t>(items_.size()), grain_, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const WorkItem& item = items_[static_cast<std::size_t>(k)];
      const auto& arrays = tensors_[static_cast<std::size_t>(item.tensor)];
      switch (state_arrays_) {
      case 0:
        probe_item<0>(arrays, item.begin, item.end);
        break;
      case 1:
        probe_item<1>(arrays, item.begin, item.end);
        break;
      case 2:
        probe_item<2>(arrays, item.begin, item.end);
        break;
      default:
        probe_item<3>(arrays, item.begin, item.end);
      }
    }
  });
}

} // namespace optjit
