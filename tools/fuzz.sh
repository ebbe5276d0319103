#!/usr/bin/env bash
# The fuzzers (tests/fuzz/): libFuzzer targets built by clang-19 with AddressSanitizer and UBSan, in a build tree of
# their own (OPTJIT_FUZZ_BUILD, default build/fuzz).
#
#   tools/fuzz.sh --build          builds them (tools/install_deps.sh --fuzz installs clang-19 and its runtime)
#   tools/fuzz.sh NAME SECONDS     builds, then runs fuzzer NAME for SECONDS seconds
#   tools/fuzz.sh --no-build NAME SECONDS    runs it as last built (ctest's fuzz.NAME, after fuzz.build)
#
# NAME is state_file, golden_case, ir or cli_text. A run starts from the checked-in seeds (tests/fuzz/corpus/NAME)
# and the inputs earlier runs found (OPTJIT_FUZZ_BUILD/corpus/NAME, where new ones go: the seeds are never
# written). A finding (a crash, a sanitizer report, an internal error, an input that allocates more than 2 GB or
# a refused input that changed the optimizer) is saved as OPTJIT_FUZZ_BUILD/findings/NAME-*; replay one with
# `OPTJIT_FUZZ_BUILD/tests/fuzz/fuzz_NAME FILE`. The exit status is the fuzzer's: 0 when it found nothing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${OPTJIT_FUZZ_BUILD:-$root/build/fuzz}"
fuzzers=(state_file golden_case ir cli_text)

build_fuzzers() {
  if ! command -v clang++-19 > /dev/null; then
    echo "fuzz.sh: clang++-19 not found: run tools/install_deps.sh --fuzz" >&2
    exit 2
  fi
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-19 \
    -DOPTJIT_FUZZ=ON -DOPTJIT_BUILD_TESTS=OFF -DOPTJIT_WERROR=ON > /dev/null
  cmake --build "$build" --target fuzzers
}

if [ "${1:-}" = "--build" ]; then
  build_fuzzers
  exit 0
fi
build_first=1
if [ "${1:-}" = "--no-build" ]; then
  build_first=0
  shift
fi
if [ $# -ne 2 ] || [[ ! " ${fuzzers[*]} " =~ " $1 " ]] || ! [[ "$2" =~ ^[0-9]+$ ]]; then
  echo "usage: tools/fuzz.sh --build | tools/fuzz.sh {${fuzzers[*]// /|}} SECONDS" >&2
  exit 2
fi
name="$1"
seconds="$2"
if ((build_first)); then
  build_fuzzers > /dev/null
fi
mkdir -p "$build/corpus/$name" "$build/findings"
# LLVM keeps process-wide state (the JIT, its target registry) that LeakSanitizer would report at exit; the
# fuzzers' own allocations are still checked per input by libFuzzer's malloc limit and ASan.
export ASAN_OPTIONS="detect_leaks=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
exec "$build/tests/fuzz/fuzz_$name" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=30 -print_final_stats=1 \
  -artifact_prefix="$build/findings/$name-" "$build/corpus/$name" "$root/tests/fuzz/corpus/$name"
