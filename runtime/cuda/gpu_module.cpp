#include "runtime/cuda/gpu_module.h"
#include "runtime/allocator.h"
#include "runtime/error.h"
#include "runtime/kernel_abi.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <utility>

namespace optjit {

int gpu_block_threads(int64_t mean_item_elements) {
  static const int forced = [] {
    const char* text = std::getenv("OPTJIT_GPU_BLOCK_THREADS");
    if (!text || !*text)
      return 0;
    const int value = std::atoi(text);
    if (value < 32 || value > kGpuMaxBlockThreads || value % 32 != 0)
      throw Error(std::string("OPTJIT_GPU_BLOCK_THREADS=") + text + ": expected a multiple of 32 from 32 to " +
                  std::to_string(kGpuMaxBlockThreads));
    return value;
  }();
  if (forced)
    return forced;
  return mean_item_elements >= 8192 ? 512 : 128;
}

GpuModule::GpuModule(int device, const std::string& ptx, const std::string& entry) : device_(device) {
  auto start = std::chrono::steady_clock::now();
  module_ = cuda::load_module(device, ptx);
  try {
    function_ = cuda::get_function(device, module_, entry);
    const int limit = std::min(cuda::max_block_threads(device, function_), kGpuMaxBlockThreads);
    max_block_threads_ = 32;
    while (max_block_threads_ * 2 <= limit)
      max_block_threads_ *= 2;
  } catch (...) {
    cuda::unload_module(device, module_);
    throw;
  }
  load_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

GpuModule::~GpuModule() {
  try {
    cuda::unload_module(device_, module_);
  } catch (const Error&) {
    // At process exit the driver may already be shutting down; the module goes with the context.
  }
}

DeviceBuffer::DeviceBuffer(int device, std::size_t bytes)
    : device_(device), ptr_(device_allocate(device, bytes)), bytes_(bytes) {}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_)
    device_release(device_, ptr_, bytes_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_)
      device_release(device_, ptr_, bytes_);
    device_ = other.device_;
    ptr_ = std::exchange(other.ptr_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

} // namespace optjit
