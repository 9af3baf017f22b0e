# Two commands work on a fresh machine: `make test` and `make demo`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# On a machine without CUDA, take the CPU build of torch that lies on disk instead of a multi-GB CUDA build.
TORCH_CPU ?= torch==2.13.0

.PHONY: install test lint demo clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if ! command -v nvidia-smi >/dev/null 2>&1; then \
	  $(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_CPU)" || echo "note: $(TORCH_CPU) not available here; pip picks torch"; \
	fi
	$(PY) -m pip install -q -e ".[dev,envs,report]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m ruff check seedfast kernels tests benchmarks
	# one thread per worker: two xdist workers on two cores (extra threads cost ~4x CPU time here)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --timeout 900 tests

demo: $(STAMP)
	$(PY) -m seedfast demo configs/demo_cpu.yaml

clean:
	rm -rf $(VENV) build *.egg-info
