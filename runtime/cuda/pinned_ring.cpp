#include "runtime/cuda/pinned_ring.h"
#include "runtime/error.h"

#include <algorithm>
#include <cstring>

namespace optjit {

PinnedRing::PinnedRing(int device, std::size_t bytes) : device_(device), bytes_(bytes) {
  host_ = static_cast<unsigned char*>(cuda::host_alloc_pinned(device, kBuffers * std::max<std::size_t>(bytes_, 16)));
  try {
    for (cuda::Event& e : copied_)
      e = cuda::event_create(device, /*timing=*/false);
  } catch (...) {
    for (cuda::Event e : copied_)
      if (e)
        cuda::event_destroy(device, e);
    cuda::host_free_pinned(device, host_);
    throw;
  }
}

PinnedRing::~PinnedRing() {
  try {
    for (std::size_t k = 0; k < kBuffers; ++k) // copies still reading a buffer end before it is freed
      if (in_flight_[k])
        cuda::event_synchronize(device_, copied_[k]);
    for (cuda::Event e : copied_)
      cuda::event_destroy(device_, e);
    cuda::host_free_pinned(device_, host_);
  } catch (const Error&) {
    // At process exit the driver may be gone already; its resources go with it.
  }
}

std::size_t PinnedRing::acquire() {
  const std::size_t buffer = next_;
  next_ = (next_ + 1) % kBuffers;
  // The copy that last read this buffer was queued kBuffers uploads ago and is almost always done: asked first, so
  // that the host waits only when it runs that far ahead of the device.
  if (in_flight_[buffer] && !cuda::event_done(device_, copied_[buffer]))
    cuda::event_synchronize(device_, copied_[buffer]);
  in_flight_[buffer] = false;
  return buffer;
}

void PinnedRing::queued(std::size_t buffer, cuda::Stream stream) {
  cuda::event_record(device_, copied_[buffer], stream);
  in_flight_[buffer] = true;
}

void PinnedRing::upload(uint64_t destination, const void* source, std::size_t bytes, cuda::Stream stream) {
  OPTJIT_ASSERT(bytes <= bytes_, "an upload larger than the ring's buffers");
  const std::size_t buffer = acquire();
  std::memcpy(data(buffer), source, bytes);
  cuda::copy_to_device_async(device_, destination, data(buffer), bytes, stream);
  queued(buffer, stream);
}

} // namespace optjit
