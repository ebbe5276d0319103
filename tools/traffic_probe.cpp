#include "tools/traffic_probe.h"
#include "compiler/binding.h"
#include "runtime/thread_pool.h"

namespace optjit {

TrafficProbe::TrafficProbe(const std::vector<int64_t>& numels) {
  for (int64_t n : numels) {
    Shape shape{n};
    tensors_.push_back({Tensor::full(shape, 1, Dtype::f32), Tensor::full(shape, 1e-3, Dtype::f32),
                        Tensor::zeros(shape, Dtype::f32), Tensor::zeros(shape, Dtype::f32)});
    bytes_ += 28 * n;
  }
  // The compiled kernels' work items and task size (their default launch shape).
  items_ = make_work_items(numels, LaunchShape{});
  grain_ = items_per_task(items_, LaunchShape{});
}

void TrafficProbe::run() {
  ThreadPool::global().parallel_for(static_cast<int64_t>(items_.size()), grain_, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const WorkItem& item = items_[static_cast<std::size_t>(k)];
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
