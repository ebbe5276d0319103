#!/usr/bin/env bash
# Packs what the GPU checks (tools/gpu_check.sh) need into one archive, .gpu/optjit-gpu.tar.xz, for a machine with a
# GPU but without LLVM, spdlog or this repository's build: the CLI and the C++ tests linked with LLVM statically
# (OPTJIT_STATIC_LLVM), spdlog's and fmt's shared libraries, and the Python package built for that machine's Python
# (OPTJIT_GPU_PYTHON, a python3.12 by default: the GPU machines' torch runs on 3.12), with nanobind from PyPI.
# Builds in build-gpu/ (git-ignored), so a second pack rebuilds only what changed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
python="${OPTJIT_GPU_PYTHON:-python3.12}"
if ! "$python" -c '' 2>/dev/null; then
  python="$(ls -d "$HOME"/.pyenv/versions/3.12.*/bin/python3 2>/dev/null | tail -1)"
  [ -n "$python" ] || { echo "gpu_pack: no python3.12 (set OPTJIT_GPU_PYTHON)" >&2; exit 1; }
fi
venv="${OPTJIT_CACHE:-$HOME/.cache/optjit}/gpu-build-$("$python" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet "nanobind==$(sed -n 's/^nanobind==\([^ ]*\).*/\1/p' python/requirements-test.txt)"
fi
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DOPTJIT_STATIC_LLVM=ON -DOPTJIT_PYTHON=ON \
  -DPython_EXECUTABLE="$venv/bin/python" -DOPTJIT_BUILD_TESTS=ON >/dev/null
cmake --build build-gpu -j"$(nproc)" --target optjit optjit_tests _optjit

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/python"
cp build-gpu/optjit build-gpu/tests/optjit_tests "$stage/bin/"
strip "$stage/bin/"*
cp -r build-gpu/python/optjit "$stage/python/"
strip "$stage/python/optjit/"*.so
# The shared libraries outside glibc and libstdc++ that the binaries still need (LLVM is inside them).
for library in $(ldd "$stage/bin/optjit" "$stage/python/optjit/"*.so | awk '/spdlog|fmt/ {print $3}' | sort -u); do
  cp -L "$library" "$stage/lib/"
done
mkdir -p .gpu
tar -C "$stage" -cf - . | xz -T0 -6 >.gpu/optjit-gpu.tar.xz
ls -l .gpu/optjit-gpu.tar.xz
