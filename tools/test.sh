#!/usr/bin/env bash
# Builds optjit with its tests (warnings are errors) and runs the whole suite with ctest: the C++ suites, and the
# Python package's tests against torch. The package is built and installed with `pip install .` into the pinned
# test environment (tools/python_env.sh: outside the clone, under ~/.cache/optjit/, built once per machine), in
# the same build tree as the C++ tests, so everything compiles once.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
venv="$(tools/python_env.sh)"
"$venv/bin/python" -m pip install --quiet --no-build-isolation --no-deps \
  -C build-dir=build -C cmake.define.OPTJIT_BUILD_TESTS=ON -C cmake.define.OPTJIT_WERROR=ON .
ctest --test-dir build --output-on-failure -j "$(nproc)"
