#include "tools/device_timing.h"
#include "runtime/cuda/cuda_driver.h"
#include "runtime/cuda/gpu_module.h"

#include <algorithm>
#include <vector>

namespace optjit {

double device_median_ms(int device, int repeats, int calls, const std::function<void()>& fn) {
  const cuda::Stream stream = cuda::stream(device);
  cuda::Event start = cuda::event_create(device), end = cuda::event_create(device);
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    cuda::event_record(device, start, stream);
    for (int c = 0; c < calls; ++c)
      fn();
    cuda::event_record(device, end, stream);
    cuda::event_synchronize(device, end);
    times.push_back(cuda::event_elapsed_ms(device, start, end) / calls);
  }
  cuda::event_destroy(device, start);
  cuda::event_destroy(device, end);
  std::nth_element(times.begin(), times.begin() + static_cast<long>(times.size() / 2), times.end());
  return times[times.size() / 2];
}

double device_copy_bandwidth(int device, std::size_t bytes) {
  DeviceBuffer from(device, bytes), to(device, bytes);
  cuda::memset_zero(device, from.address(), bytes);
  // Synchronous copies on the legacy stream are ordered with optjit's stream, so the events time them.
  const double ms =
      device_median_ms(device, 7, 5, [&] { cuda::copy_on_device(device, to.address(), from.address(), bytes); });
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3);
}

} // namespace optjit
