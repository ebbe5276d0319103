// The benchmark's traffic probes: the bytes a pass moves, at each array's width.
#include "helpers.h"
#include "tools/traffic_probe.h"

#include <doctest/doctest.h>

using namespace optjit;

TEST_CASE("traffic probe: the f32 model and the mixed model count each array's bytes at its width") {
  TrafficProbe adam({100, 0, 3});
  CHECK(adam.bytes_per_pass() == 28 * 103); // p, g, m, v in; p, m, v out
  adam.run();
  // bf16 Adam with f32 master weights and state: g16 m32 v32 master32 in, p16 m32 v32 master32 out.
  TrafficProbe mixed({100, 0, 3},
                     {{2, false, true}, {2, true, false}, {4, true, true}, {4, true, true}, {4, true, true}});
  CHECK(mixed.bytes_per_pass() == 28 * 103);
  mixed.run();
  // 8-bit AdamW's block-quantized state: p and g in f32, two moments' codes (a byte each) and scales (one f32 per
  // block of 256) read and written; 4-bit codes are a byte per two elements.
  TrafficProbe lowbit({512, 256},
                      {{4, true, true}, {4, true, false}, {1, true, true}, {4, true, true, 256}, {1, true, true, 2}});
  CHECK(lowbit.bytes_per_pass() == (12 + 2) * 768 + 8 * 3 + 2 * 384);
  lowbit.run();
  // Blocks of 36 (which do not divide the default item): items cut at whole entries, each entry counted once.
  TrafficProbe blocks({300, 40000}, {{4, true, true}, {4, true, true, 36}});
  CHECK(blocks.bytes_per_pass() == 8 * 40300 + 8 * (9 + 1112));
  blocks.run();
  optjit::test::check_error_contains([] { TrafficProbe({4}, {{3, true, false}}); }, "arrays of 1, 2, 4 or 8 bytes");
  optjit::test::check_error_contains(
      [] {
        TrafficProbe({4}, {{1, true, false, 0}});
      },
      "an entry per one or more elements");
}
