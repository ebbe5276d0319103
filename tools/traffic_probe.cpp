#include "tools/traffic_probe.h"
#include "runtime/thread_pool.h"

#include <algorithm>

namespace optjit {

TrafficProbe::TrafficProbe(const std::vector<int64_t>& numels) {
  constexpr int64_t kChunk = 32768; // the compiled kernels' work-item size
  for (int64_t n : numels) {
    Shape shape{n};
    tensors_.push_back({Tensor::full(shape, 1, Dtype::f32), Tensor::full(shape, 1e-3, Dtype::f32),
                        Tensor::zeros(shape, Dtype::f32), Tensor::zeros(shape, Dtype::f32)});
    for (int64_t b = 0; b < n; b += kChunk)
      items_.push_back({static_cast<int64_t>(tensors_.size()) - 1, b, std::min(n, b + kChunk)});
    bytes_ += 28 * n;
  }
}

void TrafficProbe::run() {
  // The compiled kernels' task size: about 65536 elements of whole work items per task.
  const int64_t items = static_cast<int64_t>(items_.size());
  const int64_t grain = items ? std::max<int64_t>(1, 65536 / std::max<int64_t>(1, bytes_ / 28 / items)) : 1;
  ThreadPool::global().parallel_for(items, grain, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const Item& item = items_[static_cast<std::size_t>(k)];
      const Buffers& t = tensors_[static_cast<std::size_t>(item.tensor)];
      float* __restrict p = t.p.data_as<float>();
      const float* __restrict g = t.g.data_as<float>();
      float* __restrict m = t.m.data_as<float>();
      float* __restrict v = t.v.data_as<float>();
      for (int64_t i = item.begin; i < item.end; ++i) {
        const float gi = g[i];
        m[i] += gi;
        v[i] += p[i];
        p[i] -= gi;
      }
    }
  });
}

} // namespace optjit
