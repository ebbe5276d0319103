#include "compiler/gpu_binding.h"
#include "runtime/error.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

namespace optjit {

// Page-locked staging for the hyperparameters: a few slots, so that writing step n+1's values never races the
// copy of step n still in flight (each slot's event is recorded after its copy).
struct GpuBinding::Staging {
  static constexpr std::size_t kSlots = 4;
  int device;
  std::size_t doubles;
  double* host = nullptr;
  std::array<cuda::Event, kSlots> copied{};
  std::array<bool, kSlots> in_flight{};
  std::array<cuda::GraphExec, kSlots> graphs{}; // copy from this slot + launch, captured for the current binding
  std::size_t next = 0;

  Staging(int d, std::size_t n) : device(d), doubles(n) {
    host = static_cast<double*>(cuda::host_alloc_pinned(device, kSlots * doubles * sizeof(double)));
    for (cuda::Event& e : copied)
      e = cuda::event_create(device);
  }
  ~Staging() {
    try {
      drop_graphs();
      for (cuda::Event e : copied)
        cuda::event_destroy(device, e);
      cuda::host_free_pinned(device, host);
    } catch (const Error&) {
      // At process exit the driver may be gone already; its resources go with it.
    }
  }

  void drop_graphs() {
    for (cuda::GraphExec& g : graphs)
      if (g)
        cuda::graph_destroy(device, std::exchange(g, nullptr));
  }

  const double* data(std::size_t slot) const { return host + slot * doubles; }

  // The next slot, once its previous copy has finished, filled with `values`.
  std::size_t stage(const std::vector<double>& values) {
    const std::size_t slot = next;
    next = (next + 1) % kSlots;
    if (in_flight[slot])
      cuda::event_synchronize(device, copied[slot]);
    std::memcpy(host + slot * doubles, values.data(), values.size() * sizeof(double));
    return slot;
  }
  void mark_copied(std::size_t slot, cuda::Stream stream) {
    cuda::event_record(device, copied[slot], stream);
    in_flight[slot] = true;
  }
};

namespace {

std::size_t align16(std::size_t bytes) { return (bytes + 15) / 16 * 16; }

} // namespace

GpuBinding::GpuBinding() = default;
GpuBinding::~GpuBinding() = default;
GpuBinding::GpuBinding(GpuBinding&&) noexcept = default;
GpuBinding& GpuBinding::operator=(GpuBinding&&) noexcept = default;

void GpuBinding::bind(const KernelPlan& plan, const ListArguments& args, int device, uint64_t carry) {
  LaunchShape shape;
  shape.chunk_elements = kGpuChunkBytes / static_cast<int64_t>(dtype_size(plan.graph.dtype));
  shape.item_per_empty_tensor = true;
  host_.bind(plan, args, shape);
  device_ = device;
  const std::size_t n = host_.group_of().size();
  std::vector<int64_t> items_of_tensor(n, 0);
  int64_t elements = 0;
  for (const WorkItem& item : host_.items()) {
    ++items_of_tensor[static_cast<std::size_t>(item.tensor)];
    elements += item.end - item.begin;
  }
  block_threads_ = gpu_block_threads(elements / std::max<int64_t>(1, n_items()));

  // One device allocation: slots | group_of | items | items_of_tensor | done | hyper | first_item | partials, each
  // 16-byte aligned.
  const std::size_t n_partials = host_.items().size() * static_cast<std::size_t>(host_.n_reduce());
  const std::size_t sizes[] = {host_.slots().size() * 8,
                               n * 8,
                               host_.items().size() * sizeof(WorkItem),
                               n * 8,
                               n * 4,
                               host_.hyper().size() * 8,
                               host_.first_item().size() * 8,
                               std::max<std::size_t>(1, n_partials) * 8};
  constexpr int kRegions = 8;
  std::size_t offsets[kRegions], total = 0;
  for (int k = 0; k < kRegions; ++k) {
    offsets[k] = total;
    total += align16(sizes[k]);
  }
  std::vector<unsigned char> image(total, 0); // the done counters start at zero
  std::memcpy(image.data() + offsets[0], host_.slots().data(), sizes[0]);
  std::memcpy(image.data() + offsets[1], host_.group_of().data(), sizes[1]);
  std::memcpy(image.data() + offsets[2], host_.items().data(), sizes[2]);
  std::memcpy(image.data() + offsets[3], items_of_tensor.data(), sizes[3]);
  std::memcpy(image.data() + offsets[5], host_.hyper().data(), sizes[5]);
  std::memcpy(image.data() + offsets[6], host_.first_item().data(), sizes[6]);
  if (table_.bytes() < total)
    table_ = DeviceBuffer(device, total);
  cuda::copy_to_device(device, table_.address(), image.data(), total);
  const uint64_t base = table_.address();
  params_.slots = base + offsets[0];
  params_.group_of = base + offsets[1];
  params_.items = base + offsets[2];
  params_.items_of_tensor = base + offsets[3];
  params_.done = base + offsets[4];
  params_.hyper = base + offsets[5];
  params_.carry = carry;
  params_.first_item = base + offsets[6];
  params_.partials = base + offsets[7];
  params_.n_tensors = static_cast<int64_t>(n);
  params_.n_hyper = static_cast<int64_t>(plan.abi.hypers.size());
  params_.n_carry = static_cast<int64_t>(plan.carries.size());
  if (!staging_ || staging_->device != device || staging_->doubles < host_.hyper().size())
    staging_ = std::make_unique<Staging>(device, host_.hyper().size());
  staging_->drop_graphs(); // they launch the previous table's items and block size
}

void GpuBinding::repoint(int slot, int64_t tensor, void* data) {
  host_.repoint(slot, tensor, data);
  const std::size_t entry = static_cast<std::size_t>(slot) * host_.group_of().size() + static_cast<std::size_t>(tensor);
  cuda::copy_to_device(device_, params_.slots + entry * 8, &data, 8);
}

void GpuBinding::launch(const GpuModule& kernel, bool use_graph) {
  OPTJIT_ASSERT(kernel.device() == device_, "a GPU kernel launches on the device it was loaded on");
  const cuda::Stream stream = cuda::stream(device_);
  const std::vector<double>& hyper = host_.hyper();
  const std::size_t slot = staging_->stage(hyper);
  auto enqueue = [&] {
    cuda::copy_to_device_async(device_, params_.hyper, staging_->data(slot), hyper.size() * sizeof(double), stream);
    void* params[] = {
#define OPTJIT_GPU_PARAM(name, type, kind) &params_.name,
#include "runtime/kernel_abi.def"
#undef OPTJIT_GPU_PARAM
    };
    cuda::launch(device_, kernel.function(), static_cast<unsigned>(n_items()), static_cast<unsigned>(block_threads_),
                 params, stream);
  };
  if (use_graph) {
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
  staging_->mark_copied(slot, stream);
}

} // namespace optjit
