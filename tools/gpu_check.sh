#!/usr/bin/env bash
# The checks that need a GPU, in one run, on a machine with an NVIDIA GPU, python3 with torch, and the archive that
# tools/gpu_pack.sh made (.gpu/optjit-gpu.tar.xz), from the repository root. Each check runs under its own time
# limit and writes its log to $OUT (or /tmp/optjit-gpu-out); a failing check does not stop the next one. Prints one
# summary line per check and exits non-zero if any failed.
#   tools/gpu_check.sh [CHECK...]   checks: info cpp python bench replay pybench (all by default)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="${OUT:-/tmp/optjit-gpu-out}"
mkdir -p "$out"
unpacked=/tmp/optjit-gpu
if [ ! -x "$unpacked/bin/optjit" ]; then
  mkdir -p "$unpacked"
  xz -dc .gpu/optjit-gpu.tar.xz | tar -C "$unpacked" -xf - || exit 1
fi
export LD_LIBRARY_PATH="$unpacked/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
# cuBLAS for the C++ checks' matrix products: torch's wheel brings one (the Python package finds it loaded by torch).
if [ -z "${OPTJIT_CUBLAS_LIBRARY:-}" ]; then
  # CUDA 12 wheels keep it in nvidia/cublas/lib, CUDA 13 wheels in nvidia/cu13/lib: any nvidia/*/lib.
  cublas="$(python3 -c 'import glob, os, nvidia; print(sorted(p for d in nvidia.__path__ for p in glob.glob(os.path.join(d, "*", "lib", "libcublas.so.*")))[0])' 2>/dev/null)"
  if [ -n "$cublas" ]; then
    export OPTJIT_CUBLAS_LIBRARY="$cublas" LD_LIBRARY_PATH="$(dirname "$cublas"):$LD_LIBRARY_PATH"
  fi
  echo "gpu_check: cuBLAS for the C++ checks: ${OPTJIT_CUBLAS_LIBRARY:-none found in torch's wheel (the loader's default)}"
else
  echo "gpu_check: cuBLAS for the C++ checks: $OPTJIT_CUBLAS_LIBRARY (OPTJIT_CUBLAS_LIBRARY)"
fi

checks=("$@")
[ ${#checks[@]} -eq 0 ] && checks=(info cpp python bench replay pybench)
summary=()
failed=0
run_check() { # NAME SECONDS COMMAND...
  local name="$1" seconds="$2" start rc
  shift 2
  start=$(date +%s)
  timeout "$seconds" "$@" >"$out/$name.log" 2>&1
  rc=$?
  summary+=("$name: rc=$rc in $(($(date +%s) - start)) s")
  [ $rc -ne 0 ] && failed=1
  echo "== $name (rc=$rc)"
  tail -n 25 "$out/$name.log"
}

for check in "${checks[@]}"; do
  case "$check" in
  info)
    run_check info 60 bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv;
      ldd --version | head -1; nproc; python3 -c "import torch; print(torch.__version__, torch.cuda.is_available())"' ;;
  cpp) # the C++ tests of the CUDA backend, but for the ptxas checks, which need no GPU and run in the suite
    run_check cpp 150 "$unpacked/bin/optjit_tests" -sf='*test_cuda.cpp' -tce='*assembles*' --duration=true ;;
  replay) # every golden case (the next/ ones too), compiled on the GPU
    run_check replay 120 "$unpacked/bin/optjit" replay --device cuda tests/golden tests/golden/next ;;
  python) # the package on CUDA tensors against torch in the same process
    run_check python 180 env PYTHONPATH="$unpacked/python" python3 -m pytest -q -p no:cacheprovider -rs \
      --durations=8 python/tests/test_cuda.py ;;
  bench)
    run_check bench 90 env OPTJIT_TORCH_BENCH="$root/tools/bench_torch.py" "$unpacked/bin/optjit" bench --device cuda ;;
  pybench) # the package against torch's foreach and fused steps, with a new grad per param before each step, Adafactor,
    # and Muon (kernels and cuBLAS products) against torch's own Muon on the matrices of a 12-layer Transformer
    run_check pybench 180 env PYTHONPATH="$unpacked/python" bash -c 'python3 -m optjit.bench --device cuda \
      --optimizers adam --modes optjit,foreach,fused && python3 -m optjit.bench --device cuda --optimizers adam \
      --shapes 10000x100 --modes optjit,fused --new-grads && python3 -m optjit.bench --device cuda \
      --optimizers adafactor --shapes 1000x10k,model --modes optjit,foreach && python3 -m optjit.bench \
      --device cuda --optimizers muon --shapes transformer12 --modes optjit,eager' ;;
  *) echo "unknown check $check"; exit 2 ;;
  esac
done
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
exit $failed
