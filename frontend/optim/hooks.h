// Hook lists as torch.optim keeps them: callables run in registration order (or prepended), each removable
// through the handle its registration returns, even from inside a running hook.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace optjit {

// torch's RemovableHandle: remove() unregisters the hook; harmless when called twice or after the list is gone.
class HookHandle {
public:
  HookHandle() = default;
  explicit HookHandle(std::function<void()> remover) : remover_(std::move(remover)) {}
  void remove() {
    if (remover_)
      std::exchange(remover_, nullptr)();
  }

private:
  std::function<void()> remover_;
};

template <class Fn> class HookList {
public:
  HookHandle add(Fn hook, bool prepend = false) {
    const uint64_t id = entries_->next_id++;
    auto& items = entries_->items;
    items.insert(prepend ? items.begin() : items.end(), {id, std::move(hook)});
    return HookHandle([weak = std::weak_ptr<Entries>(entries_), id] {
      if (auto entries = weak.lock())
        std::erase_if(entries->items, [id](const auto& item) { return item.first == id; });
    });
  }

  // Calls every hook with `args`; a snapshot is taken first, so a hook may add or remove hooks.
  template <class... Args> void run(Args&&... args) const {
    const auto snapshot = entries_->items;
    for (const auto& item : snapshot)
      item.second(args...);
  }

  bool empty() const { return entries_->items.empty(); }

private:
  struct Entries {
    uint64_t next_id = 0;
    std::vector<std::pair<uint64_t, Fn>> items;
  };
  std::shared_ptr<Entries> entries_ = std::make_shared<Entries>();
};

} // namespace optjit
