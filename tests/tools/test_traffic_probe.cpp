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
  optjit::test::check_error_contains([] { TrafficProbe({4}, {{3, true, false}}); }, "arrays of 2, 4 or 8 bytes");
}
