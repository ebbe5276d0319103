#include "compiler/backends/host_scalar_state.h"
#include "ir/interpreter.h"
#include "runtime/cuda/pinned_ring.h"
#include "runtime/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>

namespace optjit {

namespace {

// The device copy of the scalar state: per slot, one array of the list's values in the slot's dtype, and the
// host bytes they are uploaded from.
class ScalarStateMirror {
public:
  ScalarStateMirror(Device device, const std::vector<std::vector<Tensor>>& host_slots)
      : device_(device), offsets_(layout(host_slots, bytes_)) {
    storage_ = Tensor::empty({static_cast<int64_t>(bytes_ / 8)}, Dtype::f64, device); // 16-byte parts: whole f64s
    if (device.kind == DeviceKind::cuda) {
      ring_.emplace(device.index, bytes_);
      gathered_.resize(bytes_);
    }
  }

  // Whether slots of these sizes and dtypes have this copy's layout (a rebind keeps the copy and its host buffers:
  // page-locked allocations wait for the device).
  bool fits(const std::vector<std::vector<Tensor>>& host_slots) const {
    std::size_t bytes = 0;
    return layout(host_slots, bytes) == offsets_ && bytes == bytes_;
  }

  // The device tensor of entry `t` of slot `slot` (`like`'s dtype, 0-d).
  Tensor entry(std::size_t slot, std::size_t t, const Tensor& like) const {
    auto* base = static_cast<unsigned char*>(storage_.data());
    return Tensor::from_blob(base + offsets_[slot] + t * dtype_size(like.dtype()), {}, like.dtype(), {}, device_);
  }

  // Copies the host values of every slot to the device copy, queued on the launch stream (gathered in place when
  // the copy is host memory).
  void upload(const std::vector<std::vector<Tensor>>& host_slots) {
    unsigned char* bytes = ring_ ? gathered_.data() : static_cast<unsigned char*>(storage_.data());
    for (std::size_t s = 0; s < host_slots.size(); ++s)
      for (std::size_t t = 0; t < host_slots[s].size(); ++t) {
        const Tensor& value = host_slots[s][t];
        std::memcpy(bytes + offsets_[s] + t * dtype_size(value.dtype()), value.data(), dtype_size(value.dtype()));
      }
    if (ring_)
      ring_->upload(reinterpret_cast<uint64_t>(storage_.data()), bytes, bytes_, cuda::stream(device_.index));
  }

private:
  // Per slot, its offset into the copy (parts of whole 16 bytes); `bytes` gets the whole size.
  static std::vector<std::size_t> layout(const std::vector<std::vector<Tensor>>& host_slots, std::size_t& bytes) {
    std::vector<std::size_t> offsets;
    std::size_t offset = 0;
    for (const std::vector<Tensor>& slot : host_slots) {
      offsets.push_back(offset);
      offset += (slot.size() * dtype_size(slot.empty() ? Dtype::f64 : slot.front().dtype()) + 15) / 16 * 16;
    }
    bytes = std::max<std::size_t>(offset, 16);
    return offsets;
  }

  Device device_;
  std::size_t bytes_ = 0;               // before offsets_: layout() sets it while offsets_ is initialised
  std::vector<std::size_t> offsets_;    // per slot, into the copy
  Tensor storage_;                      // the device copy
  std::optional<PinnedRing> ring_;      // on a CUDA device: the upload's sources (on the host: written in place)
  std::vector<unsigned char> gathered_; // on a CUDA device: the values gathered before the upload
};

class HostScalarStateExecutable final : public Executable {
public:
  HostScalarStateExecutable(std::unique_ptr<Executable> device_code, const Graph& graph, Device device)
      : device_code_(std::move(device_code)), graph_(graph), device_(device) {
    for (const Slot& s : graph.slots)
      if (s.kind == SlotKind::Tensor && first_tensor_slot_.empty())
        first_tensor_slot_ = s.name;
  }

  void bind(const ListArguments& args) override {
    host_ = ListArguments{};
    host_.hyper_names = args.hyper_names;
    host_.hyper = args.hyper;
    host_.group_of = args.group_of;
    host_.shapes = args.shapes;
    if (host_.shapes.empty() && !first_tensor_slot_.empty())
      for (const Tensor& t : args.slot(first_tensor_slot_))
        host_.shapes.push_back(t.shape());
    // The scalar-state slots held on the host: every entry one element in host memory, of one dtype. A slot on the
    // device stays with the kernels.
    std::vector<std::string> host_slots;
    for (const std::string& name : signature_of(graph_).scalar_slots) {
      const std::vector<Tensor>& tensors = args.slot(name);
      const bool on_host = !tensors.empty() && tensors.front().device().kind == DeviceKind::cpu;
      for (const Tensor& t : tensors)
        if ((t.device().kind == DeviceKind::cpu) != on_host || (on_host && t.numel() != 1) ||
            t.dtype() != tensors.front().dtype())
          throw Error(fmt::format("scalar state '{}' is {} in one param and {} in another: a bucket's entries of a "
                                  "scalar state are all one element in host memory or all on the device, of one dtype",
                                  name, tensors.front().describe(), t.describe()));
      if (on_host) {
        host_slots.push_back(name);
        host_.slot_names.push_back(name);
        host_.slot_tensors.push_back(tensors);
      }
    }
    if (!updates_ || host_slots != host_slots_) {
      updates_ = run_host_scalar_state_pipeline(graph_, host_slots);
      host_slots_ = host_slots;
    }
    if (!mirror_ || !mirror_->fits(host_.slot_tensors))
      mirror_.emplace(device_, host_.slot_tensors);
    ListArguments on_device = args;
    for (std::size_t s = 0; s < host_slots_.size(); ++s) {
      const auto at = std::find(on_device.slot_names.begin(), on_device.slot_names.end(), host_slots_[s]);
      std::vector<Tensor>& tensors =
          on_device.slot_tensors[static_cast<std::size_t>(at - on_device.slot_names.begin())];
      for (std::size_t t = 0; t < tensors.size(); ++t)
        tensors[t] = mirror_->entry(s, t, tensors[t]);
    }
    device_code_->bind(on_device);
  }
  void repoint(const std::string& slot, int64_t entry, const Tensor& tensor) override {
    const auto at = std::find(host_slots_.begin(), host_slots_.end(), slot);
    if (at == host_slots_.end())
      return device_code_->repoint(slot, entry, tensor);
    host_.slot_tensors[static_cast<std::size_t>(at - host_slots_.begin())][static_cast<std::size_t>(entry)] = tensor;
  }
  void set_hyper(const std::vector<double>& values_by_group) override {
    host_.hyper = values_by_group;
    device_code_->set_hyper(values_by_group);
  }
  // The values from before the step go to the device, then the host's state takes the step's updates, as torch's
  // non-capturable steps increment `step` on the host before they launch.
  void start(Pauses pauses) override {
    mirror_->upload(host_.slot_tensors);
    interpret(*updates_, host_);
    device_code_->start(pauses);
  }
  bool advance(std::vector<ListPartials>& pending) override { return device_code_->advance(pending); }
  std::vector<double> carried(const std::string& name) const override { return device_code_->carried(name); }
  int64_t graph_captures() const override { return device_code_->graph_captures(); }
  const Graph* host_graph() const override { return updates_ ? &*updates_ : nullptr; }

private:
  std::unique_ptr<Executable> device_code_;
  Graph graph_;
  Device device_;
  std::vector<std::string> host_slots_; // the scalar-state slots held on the host, as bound
  std::optional<Graph> updates_;        // their updates (run_host_scalar_state_pipeline)
  std::string first_tensor_slot_;
  ListArguments host_; // the scalar-state slots, on the host, with the hyperparameters and shapes
  std::optional<ScalarStateMirror> mirror_;
};

} // namespace

std::unique_ptr<Executable> with_scalar_state_on_host(std::unique_ptr<Executable> device_code, const Graph& graph,
                                                      Device device) {
  return std::make_unique<HostScalarStateExecutable>(std::move(device_code), graph, device);
}

} // namespace optjit
