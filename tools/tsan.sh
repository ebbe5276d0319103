#!/usr/bin/env bash
# Builds the thread tests (tests/compiler/test_concurrent_steps.cpp, tests/frontend/optim/test_shard_reductions.cpp) with ThreadSanitizer, by clang-19 in a tree of
# their own (OPTJIT_TSAN_BUILD, default build/tsan), and runs them: any data race TSan reports fails the run.
#
#   tools/tsan.sh      (tools/install_deps.sh --fuzz installs clang-19)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${OPTJIT_TSAN_BUILD:-$root/build/tsan}"
if ! command -v clang++-19 > /dev/null; then
  echo "tsan.sh: clang++-19 not found: run tools/install_deps.sh --fuzz" >&2
  exit 2
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-19 \
  -DOPTJIT_TSAN=ON -DOPTJIT_BUILD_TESTS=OFF -DOPTJIT_WERROR=ON > /dev/null
cmake --build "$build" --target optjit_tsan_tests
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:${TSAN_OPTIONS:-}"
"$build/tests/tsan/optjit_tsan_tests"
