#include "compiler/backends/cuda/gpu_binding.h"
#include "compiler/backends/cuda/gpu_table.h"
#include "runtime/cuda/pinned_ring.h"
#include "runtime/error.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

namespace optjit {

// The hyperparameters' page-locked staging: each step's values go to the ring's next buffer, and the captured
// graph of each buffer (copy from it + launch) is kept for the current binding.
struct GpuBinding::Staging {
  PinnedRing ring;
  std::size_t doubles;
  std::array<cuda::GraphExec, PinnedRing::kBuffers> graphs{};

  Staging(int device, std::size_t n) : ring(device, std::max<std::size_t>(1, n) * sizeof(double)), doubles(n) {}
  ~Staging() {
    try {
      drop_graphs();
    } catch (const Error&) {
      // At process exit the driver may be gone already; its resources go with it.
    }
  }

  int device() const { return ring.device(); }
  void drop_graphs() {
    for (cuda::GraphExec& g : graphs)
      if (g)
        cuda::graph_destroy(ring.device(), std::exchange(g, nullptr));
  }
  const double* data(std::size_t buffer) const { return reinterpret_cast<const double*>(ring.data(buffer)); }

  // The next buffer, once its previous copy has finished, filled with `values`.
  std::size_t stage(const std::vector<double>& values) {
    const std::size_t buffer = ring.acquire();
    std::memcpy(ring.data(buffer), values.data(), values.size() * sizeof(double));
    return buffer;
  }
};

GpuBinding::GpuBinding() = default;
GpuBinding::~GpuBinding() = default;
GpuBinding::GpuBinding(GpuBinding&&) noexcept = default;
GpuBinding& GpuBinding::operator=(GpuBinding&&) noexcept = default;

void GpuBinding::bind(const KernelPlan& plan, const ListArguments& args, int device, uint64_t carry, uint64_t axis) {
  host_.bind(plan, args, gpu_launch_shape(plan));
  device_ = device;
  const GpuTable table = make_gpu_table(plan, host_);
  block_threads_ = table.block_threads;
  if (table_.bytes() < table.image.size())
    table_ = DeviceBuffer(device, table.image.size());
  cuda::copy_to_device(device, table_.address(), table.image.data(), table.image.size());
  const auto col_scratch_bytes = static_cast<std::size_t>(table.col_scratch_doubles) * 8;
  if (col_scratch_bytes > 0 && col_scratch_.bytes() < col_scratch_bytes)
    col_scratch_ = DeviceBuffer(device, col_scratch_bytes);
  params_ = table.at(table_.address(), carry, axis, col_scratch_bytes > 0 ? col_scratch_.address() : 0);
  host_.set_hyper_table_address(params_.hyper); // cells of hyperparameters read on the device live in that copy
  if (!staging_ || staging_->device() != device || staging_->doubles < host_.hyper().size())
    staging_ = std::make_unique<Staging>(device, host_.hyper().size());
  staging_->drop_graphs();  // they launch the previous table's items and block size
  slots_repointed_ = false; // the table just uploaded holds them
}

void GpuBinding::repoint(int slot, int64_t tensor, void* data) {
  host_.repoint(slot, tensor, data);
  slots_repointed_ = true;
}

void GpuBinding::launch(const GpuModule& kernel, bool use_graph) {
  OPTJIT_ASSERT(kernel.device() == device_, "a GPU kernel launches on the device it was loaded on");
  const cuda::Stream stream = cuda::stream(device_);
  if (slots_repointed_) { // before the launch on the same stream; a captured graph reads the table it leaves
    const std::size_t bytes = host_.slots().size() * sizeof(void*);
    if (!slot_staging_ || slot_staging_->device() != device_ || slot_staging_->bytes() < bytes)
      slot_staging_ = std::make_unique<PinnedRing>(device_, bytes);
    slot_staging_->upload(params_.slots, host_.slots().data(), bytes, stream);
    slots_repointed_ = false;
  }
  const std::vector<double>& hyper = host_.hyper();
  const std::size_t slot = staging_->stage(hyper);
  auto enqueue = [&] {
    cuda::copy_to_device_async(device_, params_.hyper, staging_->data(slot), hyper.size() * sizeof(double), stream);
    void* params[] = {
#define OPTJIT_GPU_PARAM(name, type, kind) &params_.name,
#include "runtime/kernel_abi.def"
#undef OPTJIT_GPU_PARAM
    };
    const int threads = std::min(block_threads_, kernel.max_block_threads()); // what its registers allow
    cuda::launch(device_, kernel.function(), static_cast<unsigned>(n_items()), static_cast<unsigned>(threads), params,
                 stream);
  };
  // The legacy default stream (handle 0, torch's default) cannot be captured: the step is launched as it is there.
  if (use_graph && stream != nullptr) {
    cuda::GraphExec& graph = staging_->graphs[slot];
    if (!graph) {
      cuda::begin_capture(device_, stream);
      try {
        enqueue();
      } catch (...) {
        try {
          cuda::graph_destroy(device_, cuda::end_capture(device_, stream));
        } catch (const Error&) {
          // The capture was invalidated by the failure; the first error is the one to report.
        }
        throw;
      }
      graph = cuda::end_capture(device_, stream);
      ++graph_captures_;
    }
    cuda::graph_launch(device_, graph, stream);
  } else {
    enqueue();
  }
  staging_->ring.queued(slot, stream);
}

} // namespace optjit
