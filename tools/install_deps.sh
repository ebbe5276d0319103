#!/usr/bin/env bash
# Installs what optjit builds with from Debian 12's own archive, only what is missing (safe to run again).
# --fuzz adds what the fuzzers and the ThreadSanitizer tests build with (clang-19 and its sanitizer runtimes);
# tools/test.sh passes it.
set -euo pipefail
packages=(cmake ninja-build g++ llvm-19-dev llvm-19-tools libzstd-dev libspdlog-dev doctest-dev nlohmann-json3-dev
          libcli11-dev libdnnl-dev clang-format-14 python3-venv python3-dev)
if [ "${1:-}" = "--fuzz" ]; then
  packages+=(clang-19 libclang-rt-19-dev)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
  $sudo apt-get update
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi
