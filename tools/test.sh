#!/usr/bin/env bash
# Builds optjit with its tests (warnings are errors) and runs the whole suite with ctest: the C++ suites, and the
# Python package's tests against torch. The package is built and installed with `pip install .` into the pinned
# test environment (tools/python_env.sh: outside the clone, under ~/.cache/optjit/, built once per machine), in
# the same build tree as the C++ tests, so everything compiles once.
#
# tools/test.sh --sanitize builds the C++ suite with AddressSanitizer and UBSan instead (build/sanitize, ~10 min on
# two cores) and runs it. It leaves out the Python tests (the interpreter and torch are not instrumented, and ASan
# must be the first library a process loads) and the fuzz and TSan tests (sanitizer runs of their own already).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh --fuzz
if [ "${1:-}" = "--sanitize" ]; then
  cmake -S . -B build/sanitize -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOPTJIT_SANITIZE=ON -DOPTJIT_WERROR=ON \
    -DOPTJIT_BUILD_TESTS=ON
  cmake --build build/sanitize
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
  # oneDNN (runtime/gemm.h, loaded with dlopen) runs its products on OpenMP worker threads, whose thread-local storage
  # LeakSanitizer's exit-time scan crashes on (glibc 2.36): the products run on the calling thread alone here.
  export OMP_NUM_THREADS=1
  # LeakSanitizer's tracking of dynamic TLS (__tls_get_addr) records a garbage block for oneDNN's TLS in some memory
  # layouts and its exit-time scan then crashes on it ("Tracer caught signal 11", "DTLS ... at 0x69f-0x24000017a1"):
  # not a leak, and not optjit's memory. Without the interception the scan skips dynamic TLS.
  export ASAN_OPTIONS="intercept_tls_get_addr=0:${ASAN_OPTIONS:-}"
  exec ctest --test-dir build/sanitize --output-on-failure -j "$(nproc)" -E '^(fuzz|tsan)[.]'
fi
venv="$(tools/python_env.sh)"
"$venv/bin/python" -m pip install --quiet --no-build-isolation --no-deps \
  -C build-dir=build -C cmake.define.OPTJIT_BUILD_TESTS=ON -C cmake.define.OPTJIT_WERROR=ON .
ctest --test-dir build --output-on-failure -j "$(nproc)"
