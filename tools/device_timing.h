// GPU measurements for the CLI: CUDA-event timing on optjit's stream and the device's copy bandwidth, the bar a
// memory-bound step is held to.
#pragma once

#include <cstddef>
#include <functional>

namespace optjit {

// Milliseconds per call of `fn` (which enqueues work on `device`'s optjit stream): the median over `repeats`
// event-timed batches of `calls` calls.
double device_median_ms(int device, int repeats, int calls, const std::function<void()>& fn);

// Bytes per second of a device-to-device copy of `bytes` (each byte read once and written once, as a step's
// arrays are).
double device_copy_bandwidth(int device, std::size_t bytes = std::size_t{1} << 30);

} // namespace optjit
