// CudaStreams: torch's current CUDA streams lent to optjit while a step runs, as a Python context manager
// (`with CudaStreams([(device, stream handle), ...]):`), so that the step's copies and launches queue on the streams
// torch queues the model's work on, in order with it (runtime/cuda/cuda_driver.h's StreamScope, on this thread).
#pragma once

#include "runtime/cuda/cuda_driver.h"

#include <memory>
#include <utility>
#include <vector>

namespace optjit::python {

class CudaStreams {
public:
  explicit CudaStreams(std::vector<std::pair<int, uintptr_t>> streams) : streams_(std::move(streams)) {}
  CudaStreams(const CudaStreams&) = delete;
  CudaStreams& operator=(const CudaStreams&) = delete;
  void enter() {
    for (const auto& [device, handle] : streams_)
      scopes_.push_back(std::make_unique<cuda::StreamScope>(device, reinterpret_cast<cuda::Stream>(handle)));
  }
  void exit() {
    while (!scopes_.empty()) // innermost first
      scopes_.pop_back();
  }

private:
  std::vector<std::pair<int, uintptr_t>> streams_;
  std::vector<std::unique_ptr<cuda::StreamScope>> scopes_;
};

} // namespace optjit::python
