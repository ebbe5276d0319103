#!/usr/bin/env bash
# Builds optjit with its tests (warnings are errors) and runs the whole suite with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DOPTJIT_WERROR=ON -DOPTJIT_BUILD_TESTS=ON
cmake --build build
ctest --test-dir build --output-on-failure -j "$(nproc)"
