#include "runtime/shared_memory.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <tuple>

namespace optjit {
namespace {

struct Span {
  Device device;
  uintptr_t begin, end;
  std::size_t index;
};

// Calls visit(byte offset from the tensor's data) for each element of `t`.
template <class Visit> void for_each_element_offset(const Tensor& t, Visit visit) {
  const Shape& shape = t.shape();
  const int64_t size = static_cast<int64_t>(dtype_size(t.dtype()));
  const int64_t n = shape.empty() ? 1 : shape.back(), step = shape.empty() ? 0 : t.strides().back();
  for_each_row<1>(shape, {&t.strides()}, [&](const std::array<int64_t, 1>& at) {
    for (int64_t j = 0; j < n; ++j)
      visit((at[0] + j * step) * size);
  });
}

// Whether tensor `t` holds the byte at `address`.
bool holds(const Tensor& t, uintptr_t address) {
  const auto data = reinterpret_cast<uintptr_t>(t.data());
  const auto size = static_cast<uintptr_t>(dtype_size(t.dtype()));
  bool found = false;
  for_each_element_offset(t, [&](int64_t offset) {
    const uintptr_t at = data + static_cast<uintptr_t>(offset);
    found = found || (address >= at && address < at + size);
  });
  return found;
}

// In a cluster of spans whose ranges chain into one, the first tensor (in span order) holding a byte an earlier one
// holds, and that earlier one. Bytes are tracked in units of `unit` bytes: the largest size that divides every
// element's size and address offset in the cluster.
std::optional<std::pair<std::size_t, std::size_t>> first_shared_in(const std::vector<Tensor>& tensors,
                                                                   const std::vector<Span>& cluster) {
  const uintptr_t begin = cluster.front().begin;
  uintptr_t end = 0;
  uintptr_t unit = 0;
  for (const Span& s : cluster) {
    const Tensor& t = tensors[s.index];
    end = std::max(end, s.end);
    unit = std::gcd(unit, std::gcd(static_cast<uintptr_t>(dtype_size(t.dtype())), s.begin - begin));
  }
  std::vector<uint64_t> held(((end - begin) / unit + 63) / 64, 0); // a bit per unit
  for (std::size_t k = 0; k < cluster.size(); ++k) {
    const Tensor& t = tensors[cluster[k].index];
    const uintptr_t units = dtype_size(t.dtype()) / unit;
    std::optional<uintptr_t> clash;
    for_each_element_offset(t, [&](int64_t offset) {
      const uintptr_t first = (cluster[k].begin + static_cast<uintptr_t>(offset) - begin) / unit;
      for (uintptr_t u = first; u < first + units && !clash; ++u) {
        if (held[u / 64] >> (u % 64) & 1)
          clash = begin + u * unit;
        held[u / 64] |= uint64_t{1} << (u % 64);
      }
    });
    if (clash)
      for (std::size_t j = 0; j < k; ++j) // the error path: which earlier tensor holds it
        if (holds(tensors[cluster[j].index], *clash))
          return std::pair{std::min(cluster[j].index, cluster[k].index), std::max(cluster[j].index, cluster[k].index)};
  }
  return std::nullopt;
}

} // namespace

std::optional<std::pair<std::size_t, std::size_t>> first_shared_memory(const std::vector<Tensor>& tensors) {
  std::vector<Span> spans;
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (const Tensor& t = tensors[i]; t.defined() && t.numel() > 0) {
      const auto begin = reinterpret_cast<uintptr_t>(t.data());
      spans.push_back({t.device(), begin, begin + t.span_bytes(), i});
    }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return std::tie(a.device.kind, a.device.index, a.begin) < std::tie(b.device.kind, b.device.index, b.begin);
  });
  std::optional<std::pair<std::size_t, std::size_t>> first;
  for (std::size_t k = 0; k < spans.size();) { // clusters: runs of spans each starting before the run's reach
    std::size_t last = k + 1;
    uintptr_t reach = spans[k].end;
    while (last < spans.size() && spans[last].device == spans[k].device && spans[last].begin < reach)
      reach = std::max(reach, spans[last++].end);
    if (last - k > 1) {
      const std::vector<Span> cluster(spans.begin() + static_cast<std::ptrdiff_t>(k),
                                      spans.begin() + static_cast<std::ptrdiff_t>(last));
      if (auto pair = first_shared_in(tensors, cluster); pair && (!first || pair->second < first->second))
        first = pair;
    }
    k = last;
  }
  return first;
}

} // namespace optjit
