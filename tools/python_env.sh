#!/usr/bin/env bash
# Prints the path of the Python test environment, building it first when missing: a virtual environment with the
# pinned torch, nanobind, scikit-build-core and pytest of python/requirements-test.txt. It lives outside the clone,
# under ~/.cache/optjit/ (OPTJIT_CACHE overrides), keyed by the Python version and a hash of the pins, so every
# clone and CI run on a machine shares one; the first build downloads torch (about 5 GB, a few minutes).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
requirements="$root/python/requirements-test.txt"
python="${OPTJIT_PYTHON:-python3}"
version="$("$python" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')"
key="$(sha256sum "$requirements" | cut -c1-12)"
venv="${OPTJIT_CACHE:-$HOME/.cache/optjit}/venv-$version-$key"
if [ ! -f "$venv/.complete" ]; then
  echo "python_env: building $venv (pinned torch from PyPI: the first time takes a few minutes)" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
  "$venv/bin/python" -m pip install --quiet -r "$requirements" >&2
  touch "$venv/.complete"
fi
echo "$venv"
