#!/usr/bin/env bash
# The main job: install dependencies, build optjit in Release, and run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build
./build/optjit demo
