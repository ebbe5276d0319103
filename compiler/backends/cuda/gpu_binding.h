// GpuBinding: the device-side argument table of one GPU kernel (runtime/kernel_abi.h's GpuKernelParams), built
// from a step's ListArguments like the CPU Binding and uploaded once per bind. Each step only the hyperparameters
// travel: staged in page-locked memory and copied asynchronously on the launch stream right before the kernel, so
// a step is one copy and one launch and the host never waits for the GPU.
#pragma once

#include "compiler/binding.h"
#include "runtime/cuda/cuda_driver.h"
#include "runtime/cuda/gpu_module.h"

#include <memory>

namespace optjit {

class PinnedRing;

class GpuBinding {
public:
  GpuBinding();
  ~GpuBinding();
  GpuBinding(GpuBinding&&) noexcept;
  GpuBinding& operator=(GpuBinding&&) noexcept;

  // `carry`: the plan's device carry buffer (8 bytes per tensor and carried value), shared by its kernels; `axis`:
  // its device table of axis arrays (u64 per carry, runtime/kernel_abi.def), 0 when the plan has no axis sums.
  void bind(const KernelPlan& plan, const ListArguments& args, int device, uint64_t carry, uint64_t axis);
  // Rows (columns) of every tensor together: the length of the plan's array of a carried row (column) sum.
  int64_t axis_length(CarryKind kind) const { return host_.axis_length(kind); }
  // Each list entry's param group, as bound.
  const std::vector<int64_t>& group_of() const { return host_.group_of(); }
  // Points slot `slot` of list entry `tensor` at new device data of the same shape: in the host table at once, on
  // the device with the next launch (one asynchronous upload of the slot table, however many were repointed).
  void repoint(int slot, int64_t tensor, void* data);
  void set_hyper(const std::vector<double>& values_by_group) { host_.set_hyper(values_by_group); }
  void set_hyper_addresses(const std::vector<const void*>& addresses) { host_.set_hyper_addresses(addresses); }
  // Enqueues the hyperparameter copy and the launch of `kernel` on the device's stream. With `use_graph`, the two
  // are captured into a CUDA graph once per bind (one per staging slot: the copy's source is baked in) and the
  // graph is replayed; a rebind drops the graphs, a repointed grad does not (the graph reads the table). On the
  // legacy default stream (which cannot be captured) `use_graph` launches without a graph.
  void launch(const GpuModule& kernel, bool use_graph = false);
  int64_t graph_captures() const { return graph_captures_; }
  int64_t n_items() const { return static_cast<int64_t>(host_.items().size()); }
  int device() const { return device_; }

private:
  struct Staging;

  Binding host_; // the table as the host sees it: slots hold device addresses
  int device_ = 0;
  DeviceBuffer table_;
  DeviceBuffer col_scratch_; // column partials and pending columns stores of items that cut matrices
  GpuKernelParams params_{};
  int block_threads_ = 128;
  int64_t graph_captures_ = 0;
  std::unique_ptr<Staging> staging_;
  std::unique_ptr<PinnedRing> slot_staging_; // repointed slot tables on their way to the device
  bool slots_repointed_ = false;
};

} // namespace optjit
