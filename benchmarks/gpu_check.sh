#!/usr/bin/env bash
# The GPU check of issue 20, for a machine with an NVIDIA GPU and its driver (nothing here needs a CUDA
# toolkit): install the gpu extra, run the tests marked `gpu` (a skip is a failure here) and the simulator
# tests, then the GPU benchmarks, whose rows go to benchmarks/history/gpu.jsonl and RESULTS.md through the
# benchmark harness. Usage: benchmarks/gpu_check.sh [--quick]   (PYTHON=... to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."

QUICK=""
if [ "${1:-}" = "--quick" ]; then QUICK="--quick"; fi

if [ -z "${PYTHON:-}" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  PYTHON=.venv/bin/python
fi

"$PYTHON" -m pip install -q -e '.[gpu,test]'
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || echo "nvidia-smi not found"

# Fail early, with the reason, where CuPy, numba-cuda or the device is missing.
"$PYTHON" -c "from rsketch.kernels.cuda import require_gpu; require_gpu(); print('GPU stack: ok')"

# SCIPY_ARRAY_API=1: scikit-learn's array API dispatch (the estimators on CuPy) needs SciPy's.
SCIPY_ARRAY_API=1 RSKETCH_REQUIRE_GPU=1 "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu tests/rsketch tests/decoding
"$PYTHON" -m pytest -q -p no:cacheprovider tests/rsketch/test_cuda_kernels.py

"$PYTHON" -m benchmarks.gpu $QUICK
