// Optimizer state: access by param, creation on a first step, adoption of given state (torch's, a checkpoint's), and
// the specs and dtypes of each param's entries.
#include "frontend/optim/optimizer.h"
#include "frontend/optim/optimizer_parts.h"
#include "frontend/optim/state_dtype.h"
#include "ir/block_slots.h"
#include "runtime/error.h"
#include "runtime/stochastic_rounding.h"

#include <cstring>
#include <set>
#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <utility>

namespace optjit {

using namespace optimizer_detail;

const ParamState* Optimizer::state(const Tensor& param) const {
  auto it = flat_index_of_uid_.find(param.uid());
  if (it == flat_index_of_uid_.end())
    return nullptr;
  return &states_[static_cast<std::size_t>(it->second)];
}

ParamState Optimizer::visible_state(const Tensor& param) const {
  ParamState visible;
  const ParamState* all = state(param);
  if (!all)
    return visible;
  for (const auto& entry : *all)
    if (entry.first.empty() || entry.first[0] != '_')
      visible.push_back(entry);
  return visible;
}

void Optimizer::set_state(const Tensor& param, const std::string& key, const Tensor& value) {
  auto it = flat_index_of_uid_.find(param.uid());
  if (it == flat_index_of_uid_.end())
    throw Error("set_state: the tensor is not a parameter of this optimizer");
  for (auto& [name, tensor] : states_[static_cast<std::size_t>(it->second)])
    if (name == key) {
      if (value.shape() != tensor.shape() || value.dtype() != tensor.dtype() || value.device() != tensor.device())
        throw Error("set_state: state '" + key + "' is " + tensor.describe() + ", the replacement is " +
                    value.describe() + "; shape, dtype and device must match");
      tensor = value;
      ++state_version_;
      return;
    }
  throw Error("set_state: the parameter has no state '" + key + "'");
}

void Optimizer::clear_state() {
  for (ParamState& s : states_)
    s.clear();
  ++state_version_;
}

Shape state_shape(StateKind kind, const Shape& param) {
  switch (kind) {
  case StateKind::Tensor:
    return param;
  case StateKind::Scalar:
    return {};
  case StateKind::Rows:
  case StateKind::Cols: {
    if (param.size() < 2)
      throw Error("a state of rows or columns needs a param of rank 2 or more, not " + std::to_string(param.size()));
    Shape s = param;
    s[s.size() - (kind == StateKind::Rows ? 1 : 2)] = 1;
    return s;
  }
  }
  __builtin_unreachable();
}

std::vector<StateSpec> Optimizer::step_state_specs(const Structure& structure) const {
  std::vector<StateSpec> specs = state_specs(structure);
  if (structure["master_weights"])
    specs.push_back({.name = kMasterParam, .copies_param = true});
  if (structure["stochastic_rounding"])
    specs.push_back({.name = kRoundingStream, .kind = StateKind::Scalar, .visible = false, .holds_param_index = true});
  return specs;
}

// Whether 4-bit codes of `codes` shape hold the values of a param of `param` shape two per byte: flat (torchao's), or
// in the param's shape with its last dimension halved (the layout of FSDP2's shards, python/optjit/_quantized_shards).
static bool holds_pairs_of(const Shape& codes, const Shape& param) {
  if (codes.size() == 1 && codes[0] * 2 == shape_numel(param))
    return true;
  if (codes.size() != param.size() || param.empty() || codes.back() * 2 != param.back())
    return false;
  return std::equal(codes.begin(), codes.end() - 1, param.begin());
}

// Whether state entry `t` has the shape `spec` gives it for `param`: one element for a scalar, else state_shape.
bool optimizer_detail::state_fits(const StateSpec& spec, const Tensor& t, const Tensor& param) {
  if (is_code_dtype(t.dtype())) // block-quantized codes: the param's shape, or one byte per two values (4 bits)
    return spec.kind == StateKind::Tensor &&
           (t.shape() == param.shape() || (t.dtype() == Dtype::u8 && holds_pairs_of(t.shape(), param.shape())));
  return spec.kind == StateKind::Scalar ? t.numel() == 1 : t.shape() == state_shape(spec.kind, param.shape());
}

// A new block-quantized entry of `param` whose every value starts at `initial`: its codes (the param's shape, or one
// byte per two values for 4 bits) and its scales, one per block. At 0 (most state) both are zeros, torchao's new
// state (the value 0, or -0 for the signed map's first code).
std::pair<Tensor, Tensor> optimizer_detail::new_block_state(const SlotBlocks& blocks, const Tensor& param,
                                                            double initial) {
  const ConstantBlock constant = constant_block(blocks.format, blocks.block, static_cast<float>(initial));
  Tensor codes =
      Tensor::empty(block_codes_shape(blocks.format, param.shape()), block_code_dtype(blocks.format), Device::cpu());
  std::memset(codes.data(), constant.code_byte, static_cast<std::size_t>(codes.numel()));
  const Tensor scales = Tensor::full({param.numel() / blocks.block}, constant.scale, Dtype::f32, Device::cpu());
  if (param.device().kind == DeviceKind::cpu)
    return {std::move(codes), scales};
  return {codes.to(param.device()), scales.to(param.device())};
}

std::optional<SlotBlocks> Optimizer::state_format(int64_t flat, const StateSpec& spec) const {
  const int64_t g = group_of_flat(flat);
  const ParamGroup& group = groups_[static_cast<std::size_t>(g)];
  const StateDtype dtype = state_dtype_option(group, g);
  return state_dtype_format(dtype, spec, state_block_size_option(group, g, dtype));
}

std::optional<SlotBlocks> Optimizer::new_state_blocks(int64_t flat, const StateSpec& spec) const {
  std::optional<SlotBlocks> format = state_format(flat, spec);
  if (format && !quantizes_param_of(flat_param(flat).numel(), *format))
    return std::nullopt;
  return format;
}

std::optional<SlotBlocks> Optimizer::state_blocks(int64_t flat, const StateSpec& spec) const {
  const ParamState& state = flat_state(flat);
  const Tensor codes = find_state(state, spec.name);
  if (!codes.defined())
    return spec.kind == StateKind::Tensor ? new_state_blocks(flat, spec) : std::nullopt;
  if (!is_code_dtype(codes.dtype()))
    return std::nullopt;
  return held_blocks(spec, codes, find_state(state, scales_slot_name(spec.name)), flat_param(flat).numel(),
                     state_format(flat, spec));
}

SlotBlocks optimizer_detail::held_blocks(const StateSpec& spec, const Tensor& codes, const Tensor& scales,
                                         int64_t numel, const std::optional<SlotBlocks>& group_format) {
  const BlockFormat format = held_block_format(codes.dtype(), codes.numel(), numel, spec.signed_values);
  if (numel == 0) // a process's empty shard of a quantized tensor (FSDP2): its group's format, which no codes show
    return group_format && block_code_dtype(group_format->format) == codes.dtype()
               ? *group_format
               : SlotBlocks{format, default_block_size(format)};
  const int64_t blocks = scales.defined() ? scales.numel() : 0;
  return SlotBlocks{format, blocks > 0 ? numel / blocks : 0};
}

// Whether state entry `t` may live where it does for `param`: on the param's device or, for a scalar entry of a
// param on a GPU, in host memory (where torch keeps `step` for steps that are not capturable).
bool optimizer_detail::state_device_fits(const StateSpec& spec, const Tensor& t, const Tensor& param) {
  return t.device() == param.device() || (spec.kind == StateKind::Scalar && param.device().kind == DeviceKind::cuda &&
                                          t.device().kind == DeviceKind::cpu);
}

// Which entries of the param's state are scalars held in host memory while the param is on a GPU
// (state_device_fits): bit k for the k-th entry. torch keeps `step` there for steps that are not capturable, and
// load_state_dict moves the other scalars (NAdam's mu_product, ASGD's eta) to the param's device, so a param may
// have some of each.
uint64_t optimizer_detail::host_scalar_entries(const ParamState& state, const Tensor& param) {
  uint64_t mask = 0;
  if (param.device().kind != DeviceKind::cuda)
    return mask;
  for (std::size_t k = 0; k < state.size() && k < 64; ++k)
    if (state[k].second.numel() == 1 && state[k].second.device().kind == DeviceKind::cpu)
      mask |= uint64_t{1} << k;
  return mask;
}

bool Optimizer::ensure_state() { return create_missing_state(/*only_params_with_grads=*/true); }

void Optimizer::create_state_for_every_param() { create_missing_state(/*only_params_with_grads=*/false); }

double Optimizer::initial_state_value(const ParamGroup&, const StateSpec& spec) const { return spec.initial; }

bool Optimizer::create_missing_state(bool only_params_with_grads) {
  bool created = false;
  ParamStructures structures(*this);
  for (int64_t i = 0; i < param_count(); ++i) {
    const Tensor& p = flat_param(i);
    if (only_params_with_grads && !p.impl()->grad)
      continue;
    ParamState& s = states_[static_cast<std::size_t>(i)];
    const auto g = static_cast<std::size_t>(flat_group_[static_cast<std::size_t>(i)]);
    const std::vector<StateSpec>& specs = structures.of(i).specs;
    if (s.empty() && ((clipping_ && clipping_->error_if_nonfinite) || checks_grads_finite()))
      state_created_since_grad_pass_.push_back(i); // dropped again if this step's grad pass refuses the step
    for (const StateSpec& spec : specs) {
      if (find_state(s, spec.name).defined())
        continue;
      if (refuse_incomplete_state_ && spec.visible && !s.empty())
        throw Error(fmt::format("the state of param {} has no '{}', which {} keeps with its group's options now: an "
                                "option that adds state (amsgrad, centered, momentum) was turned on after the state "
                                "was made, or the loaded state was saved without it (torch's step raises "
                                "KeyError: '{}' here)",
                                i, spec.name, name_, spec.name));
      if (const std::optional<SlotBlocks> blocks = state_blocks(i, spec)) {
        if (!p.is_contiguous())
          throw Error(fmt::format("param {} is {}: block-quantized state ({}) follows its param's row-major order, "
                                  "so its param is contiguous",
                                  i, p.describe(), block_format_name(blocks->format)));
        auto [codes, scales] = new_block_state(*blocks, p, initial_state_value(groups_[g], spec));
        s.emplace_back(spec.name, std::move(codes));
        s.emplace_back(scales_slot_name(spec.name), std::move(scales));
        created = true;
        continue;
      }
      Shape shape = state_shape(spec.kind, p.shape());
      // A complex param's state starts with every component at the value, as torch's optimizers see it through
      // view_as_real (Adagrad's sum is complex(v, v), Rprop's step_size complex(lr, lr)).
      // Tensor state takes its param's layout (torch's preserve_format), so kernels walk both flat.
      Tensor t = spec.kind != StateKind::Tensor ? Tensor::empty(shape, new_state_dtype(p, spec), p.device())
                                                : Tensor::empty_like(p, new_state_dtype(p, spec), p.device());
      if (spec.copies_param)
        t.copy_from(p.to(t.dtype())); // master weights start as the param's values
      else if (spec.holds_param_index)
        t.fill(static_cast<double>(i));
      else
        t.real_view().fill(initial_state_value(groups_[g], spec));
      s.emplace_back(spec.name, std::move(t));
      created = true;
    }
  }
  if (created)
    ++state_version_;
  return created;
}

std::vector<StateSpec> Optimizer::new_state_specs(int group) const {
  const ParamGroup& g = groups_.at(static_cast<std::size_t>(group));
  std::vector<StateSpec> specs = step_state_specs(traced_structure(g));
  for (StateSpec& spec : specs)
    spec.initial = initial_state_value(g, spec);
  return specs;
}

std::vector<StateSpec> Optimizer::param_state_specs(int64_t flat) const {
  const ParamGroup& g = groups_.at(static_cast<std::size_t>(group_of_flat(flat)));
  std::vector<StateSpec> specs = step_state_specs(param_traced_structure(flat));
  for (StateSpec& spec : specs)
    spec.initial = initial_state_value(g, spec);
  return specs;
}

// The storage dtype of each of the param's state entries, existing or still to be created.
std::vector<Dtype> optimizer_detail::state_dtypes_of(const Optimizer& o, int64_t flat,
                                                     const std::vector<StateSpec>& specs) {
  std::vector<Dtype> dtypes;
  for (const StateSpec& spec : specs) {
    const Tensor held = find_state(o.flat_state(flat), spec.name);
    const std::optional<SlotBlocks> blocks = held.defined() ? std::nullopt : o.state_blocks(flat, spec);
    dtypes.push_back(held.defined() ? held.dtype()
                     : blocks       ? block_code_dtype(blocks->format)
                                    : o.new_state_dtype(o.flat_param(flat), spec));
  }
  return dtypes;
}

std::vector<std::optional<SlotBlocks>> optimizer_detail::state_blocks_of(const Optimizer& o, int64_t flat,
                                                                         const std::vector<StateSpec>& specs) {
  std::vector<std::optional<SlotBlocks>> blocks;
  for (const StateSpec& spec : specs)
    blocks.push_back(o.state_blocks(flat, spec));
  return blocks;
}

std::vector<uint64_t> Optimizer::state_dtype_facts() const {
  ParamStructures structures(*this); // once per group where it can: the per-param loop stays cheap
  std::vector<uint64_t> facts;
  facts.reserve(static_cast<std::size_t>(param_count()));
  for (int64_t i = 0; i < param_count(); ++i) {
    uint64_t fact = host_scalar_entries(flat_state(i), flat_param(i));
    for (Dtype dtype : state_dtypes_of(*this, i, structures.of(i).specs))
      fact = fact * 257 + static_cast<uint64_t>(dtype) + 1; // 8 bits per entry: the fact changes with any of them
    for (const std::optional<SlotBlocks>& blocks : state_blocks_of(*this, i, structures.of(i).specs))
      if (blocks) // a quantized entry's format and block
        fact =
            (fact * 257 + static_cast<uint64_t>(blocks->format) + 1) * 1000003 + static_cast<uint64_t>(blocks->block);
    facts.push_back(fact);
  }
  return facts;
}

ParamState
Optimizer::state_from_entries(const Tensor& param, const std::vector<StateSpec>& specs, const ParamState& given,
                              int64_t id, int64_t flat, bool loaded,
                              const std::function<Tensor(const StateSpec&, const Tensor&)>& visible_entry) const {
  std::set<std::string> given_keys, kept_keys;
  for (const auto& entry : given)
    given_keys.insert(entry.first);
  // Hidden scalar entries (a stochastic rounding stream) live beside visible ones held in host memory, if any.
  const Device hidden_device = host_scalar_entries(given, param) != 0 ? Device::cpu() : param.device();
  ParamState state;
  // A visible entry as given; block-quantized codes with their scales (checked as every mode checks them), as given
  // when adopted, copied when loaded.
  const auto take_entry = [&](const StateSpec& spec, const Tensor& t, std::set<std::string>& keys) {
    const Tensor codes = visible_entry(spec, t);
    state.emplace_back(spec.name, codes);
    if (!is_code_dtype(t.dtype()))
      return;
    const std::string key = scales_slot_name(spec.name);
    const Tensor scales = find_state(given, key);
    if (scales.defined() && param.numel() > 0 && (scales.numel() == 0 || param.numel() % scales.numel() != 0))
      throw Error(fmt::format("state '{}' of param {} is {}: the param's {} values do not fall into {} whole blocks",
                              key, id, scales.describe(), param.numel(), scales.numel()));
    const Slot slot{spec.name, SlotRole::State, SlotKind::Tensor, Dtype::f32,
                    held_blocks(spec, t, scales, param.numel(), state_format(flat, spec))};
    check_block_slot_tensors(slot, t, scales, param.numel(), "param " + std::to_string(id));
    const bool copied = !codes.same(t); // loaded state is copied, adopted state kept as given
    if (!copied && scales.device() != param.device())
      throw Error(fmt::format("state '{}' of param {} is {}, but the param is on {}", key, id, scales.describe(),
                              param.device().to_string()));
    state.emplace_back(key, copied ? scales.clone().to(param.device()) : scales);
    keys.insert(key);
  };
  for (const StateSpec& spec : specs) {
    if (!spec.visible) {
      const double value = spec.holds_param_index ? static_cast<double>(flat) : loaded ? spec.loaded : spec.initial;
      state.emplace_back(spec.name, Tensor::full({}, value, new_state_dtype(param, spec), hidden_device));
      continue;
    }
    const Tensor t = find_state(given, spec.name);
    if (!t.defined() && spec.copies_param)
      continue; // master weights turned on after the state was made start from the param, as new state does
    kept_keys.insert(spec.name);
    if (t.defined()) // a missing key is reported below, with all
      take_entry(spec, t, kept_keys);
  }
  // An entry these options do not use but other options of the optimizer's algorithm do (max_exp_avg_sq once
  // amsgrad is switched off, SGD's momentum_buffer once momentum is 0) is kept as given, as torch keeps it: the
  // optimizer's own state_dict() after such a switch loads back, and switching the option on again continues from
  // it, with the hidden entries that go with it at their loaded values. Keys no options keep are refused, and so is
  // a master copy (master_param) in a group without master weights: its presence would change the forloop's math.
  std::set<std::string> known_keys = kept_keys;
  const Structure every = param_traced_structure(flat).with_every_flag();
  const std::vector<StateSpec> every_spec = state_specs(every); // the algorithm's own, without optjit's extras
  bool kept_extra = false;
  for (const StateSpec& spec : every_spec)
    if (spec.visible && !kept_keys.count(spec.name))
      if (const Tensor t = find_state(given, spec.name); t.defined()) {
        known_keys.insert(spec.name);
        take_entry(spec, t, known_keys);
        kept_extra = true;
      }
  for (const StateSpec& spec : every_spec)
    if (kept_extra && !spec.visible && !find_state(state, spec.name).defined())
      state.emplace_back(spec.name, Tensor::full({}, loaded ? spec.loaded : spec.initial, new_state_dtype(param, spec),
                                                 hidden_device));
  if (!std::includes(given_keys.begin(), given_keys.end(), kept_keys.begin(), kept_keys.end()) ||
      !std::includes(known_keys.begin(), known_keys.end(), given_keys.begin(), given_keys.end()))
    throw Error(fmt::format("state of param {} has keys {}, but {} with these options keeps {}", id, given_keys, name_,
                            kept_keys));
  return state;
}

void Optimizer::adopt_state(int64_t flat, const ParamState& visible, StateOrigin origin) {
  if (flat < 0 || flat >= param_count())
    throw Error(fmt::format("adopt_state: param {} is not one of the {} params", flat, param_count()));
  const Tensor& param = flat_param(flat);
  ParamState adopted;
  if (!visible.empty())
    adopted = state_from_entries(
        param, param_state_specs(flat), visible, flat, flat, origin == StateOrigin::Loaded,
        [&](const StateSpec& spec, const Tensor& t) {
          const bool scalar = spec.kind == StateKind::Scalar;
          if (!state_fits(spec, t, param))
            throw Error(fmt::format("state '{}' of param {} is {}, but {}", spec.name, flat, t.describe(),
                                    scalar ? std::string("a scalar state holds one element")
                                    : spec.kind == StateKind::Tensor
                                        ? "the param is " + param.describe()
                                        : fmt::format("it holds the param's rows or "
                                                      "columns, shape [{}]",
                                                      fmt::join(state_shape(spec.kind, param.shape()), ", "))));
          if (!scalar && is_complex(t.dtype()) != is_complex(param.dtype()))
            throw Error(fmt::format("state '{}' of param {} is {}, but the param is {}: a complex param keeps complex "
                                    "state, a real param real state",
                                    spec.name, flat, t.describe(), param.describe()));
          if (!scalar && !is_code_dtype(t.dtype()) && find_state(visible, scales_slot_name(spec.name)).defined())
            throw Error(fmt::format("state '{}' of param {} is {}, beside the scales '{}' of block-quantized state, "
                                    "whose codes are uint8 or float8_e4m3fn (torch's load_state_dict casts them to "
                                    "the param's dtype; optjit.compile restores them)",
                                    spec.name, flat, t.describe(), scales_slot_name(spec.name)));
          if (spec.copies_param && t.dtype() != Dtype::f32)
            throw Error(fmt::format("state '{}' of param {} is {}: master weights are f32 (torch's load_state_dict "
                                    "casts every state entry but step to the param's dtype; optjit.compile keeps "
                                    "the f32 copy across it)",
                                    spec.name, flat, t.describe()));
          if (!state_device_fits(spec, t, param) || !t.is_non_overlapping())
            throw Error(fmt::format("state '{}' of param {} is {}: it must be on the param's device ({}; a scalar "
                                    "state of a GPU param may be on the CPU), each element at an address of its own",
                                    spec.name, flat, t.describe(), param.device().to_string()));
          return t;
        });
  states_[static_cast<std::size_t>(flat)] = std::move(adopted);
  ++state_version_;
}

} // namespace optjit
