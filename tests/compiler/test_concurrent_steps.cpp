// Compiled steps from several threads at once. Each compiled step belongs to one optimizer and is called from one
// thread at a time, but different optimizers' steps may run concurrently: they share the kernel cache, the JIT and
// the CPU thread pool; and each compile runs its kernels' compiles on threads of its own. tools/tsan.sh runs this file
// under ThreadSanitizer too (ctest: tsan.concurrent_steps). A kernel two threads ask the cache for at once compiles
// once.
#include "codegen/codegen.h"
#include "compiler/kernel_cache.h"
#include "helpers.h"

#include <atomic>
#include <barrier>
#include <chrono>
#include <exception>
#include <optional>
#include <thread>

using namespace optjit;
using namespace optjit::test;

namespace {

constexpr int kSteps = 6;

// Two optimizers on disjoint params, each compiled on its first call and stepped kSteps times with fresh grads.
struct Pair {
  std::string name[2];
  KeywordOptions options[2];
};

std::vector<Tensor> params_for(int which) {
  return random_params({{300, 700}, {513}, {3, 5, 7}}, Dtype::f32, 40 + static_cast<uint64_t>(which));
}

// Steps optimizer `which` of the pair on its own params; `sync` (when given) is waited on before every step, so the
// two threads compile and step at the same moments.
void run_one(const Pair& pair, int which, std::vector<Tensor>& params, std::barrier<>* sync) {
  params = params_for(which);
  KeywordOptions options = pair.options[which];
  options["foreach"] = {1};
  auto opt = make_optimizer(pair.name[which], {ParamGroupSpec{params, {}}}, options);
  CompiledStep step = compile(*opt);
  for (int t = 0; t < kSteps; ++t) {
    randomize_grads(params, 100 * static_cast<uint64_t>(which) + static_cast<uint64_t>(t));
    if (sync)
      sync->arrive_and_wait();
    step();
  }
}

} // namespace

TEST_CASE("threads: two compiled steps on disjoint params, stepped from two threads at once, match a serial run") {
  const std::vector<Pair> pairs = {
      {{"Adam", "Adam"}, {{{"amsgrad", {1}}}, {{"amsgrad", {1}}}}}, // one kernel, shared through the cache
      {{"AdamW", "RMSprop"}, {{{"weight_decay", {0.1}}}, {{"centered", {1}}, {"momentum", {0.9}}}}},
      // Plans of several kernels, each compiling its kernels at once (Backend::prepare) beside the other thread's.
      {{"Adafactor", "LAMB"}, {{{"weight_decay", {0.1}}}, {{"weight_decay", {0.01}}}}},
  };
  for (const Pair& pair : pairs) {
    INFO(pair.name[0] << " and " << pair.name[1]);
    std::vector<Tensor> serial[2], concurrent[2];
    for (int which = 0; which < 2; ++which)
      run_one(pair, which, serial[which], nullptr);

    KernelCache<CpuKernel>::global().clear(); // the threads compile every kernel again, at the same time
    std::barrier<> sync(2);
    std::exception_ptr failure[2];
    std::vector<std::thread> threads;
    for (int which = 0; which < 2; ++which)
      threads.emplace_back([&, which] {
        try {
          run_one(pair, which, concurrent[which], &sync);
        } catch (...) {
          failure[which] = std::current_exception();
          sync.arrive_and_drop();
        }
      });
    for (std::thread& thread : threads)
      thread.join();
    for (int which = 0; which < 2; ++which) {
      REQUIRE_FALSE(failure[which]);
      for (std::size_t i = 0; i < serial[which].size(); ++i)
        CHECK(serial[which][i].to_vector() == concurrent[which][i].to_vector());
    }
  }
}

TEST_CASE("threads: one optimizer stepped from two threads at once: every step runs whole or is refused") {
  for (const bool compiled : {true, false}) {
    for (const bool foreach : {true, false}) {
      if (compiled && !foreach)
        continue;
      INFO(std::string(compiled ? "compiled" : foreach ? "eager" : "forloop"));
      std::vector<Tensor> params = random_params({{200, 50}, {7}}, Dtype::f32, 3);
      auto opt = make_single_group("adam", params, {}, foreach);
      std::optional<CompiledStep> step;
      if (compiled)
        step.emplace(compile(*opt));
      std::atomic<int> ran{0}, refused{0};
      std::barrier<> start(2);
      auto stepper = [&] {
        start.arrive_and_wait();
        for (int s = 0; s < 100; ++s) {
          try {
            compiled ? (*step)() : opt->step();
            ++ran;
          } catch (const Error& e) {
            CHECK(std::string(e.what()).find("is already being stepped (from another thread)") != std::string::npos);
            ++refused;
          }
        }
      };
      std::thread a(stepper), b(stepper);
      a.join();
      b.join();
      CHECK(ran + refused == 200);
      // Each step that ran counted once: a refused one changed nothing.
      CHECK(find_state(opt->visible_state(params[0]), "step").item() == ran.load());
    }
  }
}

namespace {

// Runs cache.get_or_compile(key, make) from two threads, the second asking only once the first is inside make(),
// which then waits (up to 10 s, so that a cache that compiles twice fails instead of hanging) until the second has
// found the compile in flight. Returns each thread's error message ("" for none) and hit.
struct TwoAsks {
  std::string errors[2];
  bool hit[2] = {false, false};
  std::shared_ptr<int> got[2];
};
TwoAsks ask_twice(KernelCache<int>& cache, const std::string& key, bool fail, std::atomic<int>& compiles) {
  TwoAsks asks;
  std::atomic<bool> entered{false};
  const int64_t hits_before = cache.stats().hits;
  const auto make = [&]() -> std::shared_ptr<int> {
    ++compiles;
    entered = true;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (cache.stats().hits == hits_before && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    if (fail)
      throw Error("no such kernel");
    return std::make_shared<int>(7);
  };
  std::thread threads[2];
  for (int t = 0; t < 2; ++t)
    threads[t] = std::thread([&, t] {
      while (t == 1 && !entered)
        std::this_thread::yield();
      try {
        asks.got[t] = cache.get_or_compile(key, make, asks.hit[t]);
      } catch (const Error& e) {
        asks.errors[t] = e.what();
      }
    });
  for (std::thread& t : threads)
    t.join();
  return asks;
}

} // namespace

TEST_CASE("threads: a kernel two threads ask for at once compiles once, and its error reaches both") {
  KernelCache<int> cache(4);
  std::atomic<int> compiles{0};
  const TwoAsks ok = ask_twice(cache, "k", false, compiles);
  CHECK(compiles == 1);
  CHECK(ok.got[0] == ok.got[1]);
  CHECK(*ok.got[0] == 7);
  CHECK(!ok.hit[0]);
  CHECK(ok.hit[1]);
  CHECK(cache.stats().misses == 1);

  const TwoAsks failed = ask_twice(cache, "bad", true, compiles);
  CHECK(compiles == 2);
  CHECK(failed.errors[0] == "no such kernel");
  CHECK(failed.errors[1] == "no such kernel");
  bool again = true; // a failed compile is not cached: the next ask compiles again
  CHECK(*cache.get_or_compile(
            "bad", [] { return std::make_shared<int>(8); }, again) == 8);
  CHECK(!again);
}
