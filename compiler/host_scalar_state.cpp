#include "compiler/host_scalar_state.h"
#include "compiler/ir/interpreter.h"
#include "passes/passes.h"
#include "runtime/error.h"
#include "runtime/pinned_ring.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>

namespace optjit {

Graph scalar_state_updates(const Graph& graph) {
  Graph updates = graph;
  std::erase_if(updates.stores, [](const Store& s) { return s.kind != StoreKind::Scalar; });
  updates = eliminate_dead_code(updates);
  for (const Store& s : updates.stores) {
    std::vector<ValueId> pending{s.value};
    while (!pending.empty()) {
      const ValueId id = pending.back();
      pending.pop_back();
      const Node& n = updates.node(id);
      if (n.level == Level::Element || op_has_trait(n.op, kReduction) || op_has_trait(n.op, kListReduction) ||
          n.op == Op::carried)
        throw Error(fmt::format("graph @{}: scalar state '{}' is computed from tensor data (%{} = {}), which only the "
                                "params' device has: keep this state on the params' device",
                                graph.name, s.name, id, op_name(n.op)));
      pending.insert(pending.end(), n.inputs.begin(), n.inputs.end());
    }
  }
  return updates;
}

namespace {

// The device copy of the scalar state: per slot, one array of the list's values in the slot's dtype, and the
// host bytes they are uploaded from.
class ScalarStateMirror {
public:
  ScalarStateMirror(Device device, const std::vector<std::vector<Tensor>>& host_slots) : device_(device) {
    std::size_t offset = 0;
    for (const std::vector<Tensor>& slot : host_slots) {
      const Dtype dtype = slot.empty() ? Dtype::f32 : slot.front().dtype();
      offsets_.push_back(offset);
      offset += (slot.size() * dtype_size(dtype) + 15) / 16 * 16;
    }
    bytes_ = std::max<std::size_t>(offset, 16);
    storage_ = Tensor::empty({static_cast<int64_t>(bytes_ / 8)}, Dtype::f64, device); // 16-byte parts: whole f64s
    if (device.kind == DeviceKind::cuda)
      ring_.emplace(device.index, bytes_);
  }

  // The device tensor of entry `t` of slot `slot` (`like`'s dtype, 0-d).
  Tensor entry(std::size_t slot, std::size_t t, const Tensor& like) const {
    auto* base = static_cast<unsigned char*>(storage_.data());
    return Tensor::from_blob(base + offsets_[slot] + t * dtype_size(like.dtype()), {}, like.dtype(), {}, device_);
  }

  // Copies the host values of every slot to the device copy, queued on the launch stream.
  void upload(const std::vector<std::vector<Tensor>>& host_slots) {
    std::optional<std::size_t> buffer;
    unsigned char* bytes = nullptr;
    if (ring_) {
      buffer = ring_->acquire();
      bytes = ring_->data(*buffer);
    } else {
      bytes = static_cast<unsigned char*>(storage_.data());
    }
    for (std::size_t s = 0; s < host_slots.size(); ++s)
      for (std::size_t t = 0; t < host_slots[s].size(); ++t) {
        const Tensor& value = host_slots[s][t];
        std::memcpy(bytes + offsets_[s] + t * dtype_size(value.dtype()), value.data(), dtype_size(value.dtype()));
      }
    if (ring_) {
      const cuda::Stream stream = cuda::stream(device_.index);
      cuda::copy_to_device_async(device_.index, reinterpret_cast<uint64_t>(storage_.data()), bytes, bytes_, stream);
      ring_->queued(*buffer, stream);
    }
  }

private:
  Device device_;
  std::vector<std::size_t> offsets_; // per slot, into the copy
  std::size_t bytes_ = 0;
  Tensor storage_;                 // the device copy
  std::optional<PinnedRing> ring_; // on a CUDA device: the upload's sources (on the host: written in place)
};

class HostScalarStateExecutable final : public Executable {
public:
  HostScalarStateExecutable(std::unique_ptr<Executable> device_code, const Graph& graph, Device device)
      : device_code_(std::move(device_code)), updates_(scalar_state_updates(graph)), device_(device),
        scalar_slots_(signature_of(graph).scalar_slots) {
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
    for (const std::string& name : scalar_slots_) {
      const std::vector<Tensor>& tensors = args.slot(name);
      for (const Tensor& t : tensors)
        if (t.device().kind != DeviceKind::cpu || t.numel() != 1 || t.dtype() != tensors.front().dtype())
          throw Error(fmt::format("scalar state '{}' held on the host is {}: each entry must be one element in host "
                                  "memory, all of one dtype ({})",
                                  name, t.describe(), tensors.front().describe()));
      host_.slot_names.push_back(name);
      host_.slot_tensors.push_back(tensors);
    }
    mirror_.emplace(device_, host_.slot_tensors);
    ListArguments on_device = args;
    for (std::size_t s = 0; s < scalar_slots_.size(); ++s) {
      const auto at = std::find(on_device.slot_names.begin(), on_device.slot_names.end(), scalar_slots_[s]);
      std::vector<Tensor>& tensors =
          on_device.slot_tensors[static_cast<std::size_t>(at - on_device.slot_names.begin())];
      for (std::size_t t = 0; t < tensors.size(); ++t)
        tensors[t] = mirror_->entry(s, t, tensors[t]);
    }
    device_code_->bind(on_device);
  }
  void repoint(const std::string& slot, int64_t entry, const Tensor& tensor) override {
    const auto at = std::find(scalar_slots_.begin(), scalar_slots_.end(), slot);
    if (at == scalar_slots_.end())
      return device_code_->repoint(slot, entry, tensor);
    host_.slot_tensors[static_cast<std::size_t>(at - scalar_slots_.begin())][static_cast<std::size_t>(entry)] = tensor;
  }
  void set_hyper(const std::vector<double>& values_by_group) override {
    host_.hyper = values_by_group;
    device_code_->set_hyper(values_by_group);
  }
  // The values from before the step go to the device, then the host's state takes the step's updates, as torch's
  // non-capturable steps increment `step` on the host before they launch.
  void start() override {
    mirror_->upload(host_.slot_tensors);
    interpret(updates_, host_);
    device_code_->start();
  }
  bool advance(std::vector<ListPartials>& pending) override { return device_code_->advance(pending); }
  std::vector<double> carried(const std::string& name) const override { return device_code_->carried(name); }
  int64_t graph_captures() const override { return device_code_->graph_captures(); }

private:
  std::unique_ptr<Executable> device_code_;
  Graph updates_;
  Device device_;
  std::vector<std::string> scalar_slots_;
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
