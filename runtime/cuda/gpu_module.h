// A PTX module loaded on one CUDA device and its kernel entry, unloaded when the last user lets go (the kernel
// cache shares it between compiled steps of the same structure).
#pragma once

#include "runtime/cuda/cuda_driver.h"

#include <string>

namespace optjit {

class GpuModule {
public:
  // Loads `ptx` with the driver's JIT (its error log ends up in the exception) and finds `entry`.
  GpuModule(int device, const std::string& ptx, const std::string& entry);
  ~GpuModule();
  GpuModule(const GpuModule&) = delete;
  GpuModule& operator=(const GpuModule&) = delete;

  int device() const { return device_; }
  cuda::Function function() const { return function_; }
  double load_ms() const { return load_ms_; }
  // The most threads a block of this kernel launches with: the driver's limit for its registers (ptxas is given no
  // cap, so it never spills to fit 512 threads), as a power of two, at most kGpuMaxBlockThreads.
  int max_block_threads() const { return max_block_threads_; }

private:
  int device_;
  cuda::Module module_ = nullptr;
  cuda::Function function_ = nullptr;
  double load_ms_ = 0;
  int max_block_threads_ = 0;
};

// Device memory owned by one object (from the caching allocator), released on destruction.
class DeviceBuffer {
public:
  DeviceBuffer() = default;
  DeviceBuffer(int device, std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;

  uint64_t address() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

private:
  int device_ = 0;
  uint64_t ptr_ = 0;
  std::size_t bytes_ = 0;
};

} // namespace optjit
