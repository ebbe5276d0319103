// PinnedRing: a few page-locked host buffers used in turn as the sources of asynchronous uploads to a device, so
// that the host fills the next step's values while the copies of earlier steps are still in flight, and never
// overwrites a buffer before its last copy has ended (an event recorded after the copies from it).
#pragma once

#include "runtime/cuda/cuda_driver.h"

#include <array>
#include <cstddef>

namespace optjit {

class PinnedRing {
public:
  static constexpr std::size_t kBuffers = 4;

  PinnedRing(int device, std::size_t bytes);
  ~PinnedRing();
  PinnedRing(const PinnedRing&) = delete;
  PinnedRing& operator=(const PinnedRing&) = delete;

  int device() const { return device_; }
  std::size_t bytes() const { return bytes_; } // of each buffer
  // The next buffer in turn, once the copies from it queued before have ended.
  std::size_t acquire();
  unsigned char* data(std::size_t buffer) const { return host_ + buffer * bytes_; }
  // The copies from `buffer` are queued on `stream`: acquire() waits for them before handing it out again.
  void queued(std::size_t buffer, cuda::Stream stream);
  // `bytes` (at most bytes()) from `source` to device address `destination`, through the next buffer, queued on
  // `stream`: the host may change `source` as soon as this returns.
  void upload(uint64_t destination, const void* source, std::size_t bytes, cuda::Stream stream);

private:
  int device_;
  std::size_t bytes_;
  unsigned char* host_ = nullptr;
  std::array<cuda::Event, kBuffers> copied_{};
  std::array<bool, kBuffers> in_flight_{};
  std::size_t next_ = 0;
};

} // namespace optjit
