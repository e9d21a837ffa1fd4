# The two commands (README.md):
#   make demo   set up from a fresh clone, record a small training run on CUDA
#               (the GPU, or a virtual H100 where there is none), explain its peak
#   make test   set up from a fresh clone (Chromium from Debian for the HTML tests
#               included) and run the tests (.ci/run runs this): everything but the
#               `cuda` tests, then the `cuda` tests on the virtual GPU, on torch
#               2.14; and on torch 2.11 at the same time (the two use one core
#               each), those whose outcome depends on torch (not `torch_agnostic`);
#               neither runs the `heavy` tests, which make test-full runs on both
#
# Set-up makes .venv with the pinned torch (a CUDA build, so the CUDA wrapper
# and the virtual GPU compile here even without a GPU) and builds in place.
# `make test-system` builds and tests against the python3 on PATH and its
# torch instead (e.g. a GPU machine with torch preinstalled and no network);
# `make gpu-check` does that on a GPU machine and measures what only a GPU can
# tell, into one folder to bring back (GPU_CHECK_OUT).

# Where PYTHONDONTWRITEBYTECODE is set (these machines set it), nothing
# writes the bytecode of allocscope (installed in place), of the tests or of
# pytest's rewritten test modules, so each of the hundreds of processes the
# tests start compiled them anew: collecting the tests took 7.5 s a session
# instead of 4. Bytecode goes to __pycache__ folders, which git ignores.
unexport PYTHONDONTWRITEBYTECODE

PYTHON ?= python3
TORCH ?= 2.14.1
VENV := .venv
PY := $(VENV)/bin/python
SOURCES := $(wildcard csrc/*/*.cpp csrc/*/*.h csrc/vgpu/*.inc) setup.py tests/native/build.py
COMPAT_TORCH := 2.11.0
COMPAT_VENV := .venv-torch$(COMPAT_TORCH)
# What make test leaves out, for time: the `heavy` tests (several
# multi-process jobs each: HSDP/FSDP1 and a rank alone against four
# processes, object collectives, fit over ranks, the two largest OOM
# post-mortems), about 90 s of the 10 minutes; make test-full runs
# everything on both torches.
MAIN_EXCLUDE ?= and not heavy
# For make test's 10 minutes, the compat torch leaves out the many_gpus
# tests too (the virtual cards' NCCL, ranks alone of large jobs, pipelines:
# about 110 s of its 400 s of cuda tests). Its allocator, the wrapper and the
# version guards in csrc/ stay checked by its cuda tests; what the many_gpus
# tests would add there is torch.distributed's own code at 2.11, which
# make test-full runs.
# The fixed subset of PyTorch's own tests (tests/integration/test_conformance.py,
# about 50 s) runs on the main torch alone; make conformance runs every suite
# on both.
COMPAT_EXCLUDE ?= and not heavy and not many_gpus and not conformance
# The virtual GPU the `cuda` tests run on where there is no GPU.
VGPU ?= H100-80GB
# Two sessions: the virtual GPU makes CUDA available to the whole process,
# which would change what the CPU-path tests exercise. $(3): more of the
# marker expression (the compat torch runs only what depends on torch).
PYTEST_CPU = echo "allocscope tests: $$($(1) -c 'import torch; print(torch.__version__)'), not cuda $(3)" && \
	$(1) -m pytest -q tests -m "not cuda $(3)" $(2)
PYTEST_CUDA = echo "allocscope tests: $$($(1) -c 'import torch; print(torch.__version__)'), cuda on a virtual $(VGPU) $(3)" && \
	$(1) -m pytest -q tests -m "cuda $(3)" --vgpu $(VGPU) --tb=short $(2)
PYTEST_SESSIONS = $(call PYTEST_CPU,$(1),$(2),$(3)) && $(call PYTEST_CUDA,$(1),$(2),$(3))
GPU_CHECK_OUT ?= gpu-check
# the whole folder packed into one .tar.gz after every step (a device call
# brings back 8 files at most): e.g. GPU_CHECK_OUT=/tmp/gpu-check
# GPU_CHECK_ARCHIVE=$$OUT/gpu-check.tar.gz, the folder outside $$OUT
GPU_CHECK_ARCHIVE ?=
# e.g. "--deadline $$(($$(date +%s) + 540))" to end inside a time limit
GPU_CHECK_ARGS ?=

.PHONY: demo test test-full test-main test-main-cpu test-main-cpu-fit test-main-cpu-agnostic \
	test-main-cpu-agnostic-integration test-main-cpu-agnostic-unit test-main-cuda test-main-many-gpus test-compat test-serving test-system conformance gpu-check browser bench clean

# CUDA first: on the GPU if there is one, else on a virtual H100 (torch's real
# caching allocator); then a shorter CPU recording.
demo: $(VENV)/.built
	$(PY) -m allocscope run $$($(PY) -c "import torch; print('' if torch.cuda.is_available() else '--gpu $(VGPU)')") \
	  -f -o demo.alsc -- $(PY) examples/train.py --steps 3
	$(PY) -m allocscope info demo.alsc
	$(PY) -m allocscope report demo.alsc
	$(PY) -m allocscope html -f demo.alsc -o demo.html
	$(PY) -m allocscope run --device cpu -f -o demo-cpu.alsc -- $(PY) examples/train.py --steps 2 --device cpu
	$(PY) -m allocscope info demo-cpu.alsc

# Two jobs at a time, one a core, each target's output printed whole when it
# ends, in this order as slots free: the main torch's set-up and its
# torch-dependent CPU tests beside the compat torch's set-up and sessions
# (about 3 minutes of set-up each); then the main torch's other sessions,
# longest first, in whichever slot frees. Measured from a fresh clone on 2
# cores: benchmarks/results/make_test_*.json.
FIT_TESTS := tests/integration/test_fit_cli.py
# After the first two, longest first (the slots then end close together):
# the cuda tests (2.5 min), fit's (2), the other torch_agnostic tests of
# tests/integration (1.5), the many_gpus tests (0.6), the unit tests (0.4).
MAIN_TARGETS := test-main-cpu test-compat test-main-cuda test-main-cpu-fit test-main-cpu-agnostic-integration \
	test-main-many-gpus test-main-cpu-agnostic-unit
# (Chromium first, on its own: as a prerequisite of the first target, make
# ran the other targets while it installed and started that target last,
# with one slot idle at the end.)
# How many targets at a time: one a core. Three on two cores were no faster
# (952 s against 960 s from a fresh clone; the tests are CPU-bound:
# results/make_test_issue49*.json).
TEST_JOBS ?= 2
test: browser
	@$(MAKE) --no-print-directory -j$(TEST_JOBS) --output-sync=target $(MAIN_TARGETS)

# Everything on both torches (the `heavy` tests too): about three minutes
# more than make test.
test-full: browser
	@$(MAKE) --no-print-directory -j$(TEST_JOBS) --output-sync=target COMPAT_EXCLUDE= MAIN_EXCLUDE= $(MAIN_TARGETS)

test-main: browser test-main-cpu test-main-cuda test-main-cpu-fit test-main-cpu-agnostic test-main-many-gpus

test-main-cpu: $(VENV)/.built
	$(call PYTEST_CPU,$(PY),-p no:cacheprovider,and not torch_agnostic $(MAIN_EXCLUDE))

test-main-cpu-agnostic: test-main-cpu-agnostic-integration test-main-cpu-agnostic-unit

# The torch_agnostic CPU tests in two jobs, for make test's slots to end together.
test-main-cpu-agnostic-integration: $(VENV)/.built
	@echo "allocscope tests: $$($(PY) -c 'import torch; print(torch.__version__)'), not cuda and torch_agnostic (tests/integration but $(FIT_TESTS))"
	$(PY) -m pytest -q tests/integration --ignore=$(FIT_TESTS) -m "not cuda and torch_agnostic $(MAIN_EXCLUDE)" -p no:cacheprovider

test-main-cpu-agnostic-unit: $(VENV)/.built
	@echo "allocscope tests: $$($(PY) -c 'import torch; print(torch.__version__)'), not cuda and torch_agnostic (tests/unit)"
	$(PY) -m pytest -q tests/unit -m "not cuda and torch_agnostic $(MAIN_EXCLUDE)" -p no:cacheprovider

# A job of its own, to balance make test's two slots.
test-main-cpu-fit: $(VENV)/.built
	@echo "allocscope tests: $$($(PY) -c 'import torch; print(torch.__version__)'), not cuda and torch_agnostic ($(FIT_TESTS))"
	$(PY) -m pytest -q $(FIT_TESTS) -m "not cuda and torch_agnostic $(MAIN_EXCLUDE)" -p no:cacheprovider

test-main-cuda: $(VENV)/.built
	$(call PYTEST_CUDA,$(PY),-p no:cacheprovider,and not many_gpus $(MAIN_EXCLUDE))

test-main-many-gpus: $(VENV)/.built
	$(call PYTEST_CUDA,$(PY),-p no:cacheprovider,and many_gpus $(MAIN_EXCLUDE))

# The HTML report's tests drive a headless Chromium from Debian's packages.
# Without one (no root, no package mirror) those tests are skipped, loudly;
# under CI=true they fail.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo "sudo -n" ); \
	  $$SUDO apt-get install -y -q chromium >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null 2>&1 && $$SUDO apt-get install -y -q chromium >/dev/null 2>&1; } || \
	  echo "WARNING: Chromium could not be installed: the browser tests will be skipped"; }

# (Not --no-compile: with PYTHONDONTWRITEBYTECODE set, as it was before the
# unexport above, nothing ever wrote the bytecode it leaves out, and every
# process compiled torch from source: make test took 1,030 s instead of 606.)
PIP_INSTALL = -m pip install -q
# Optional dependencies that tests exercise with the real library: IPython
# (the notebook magic, allocscope.harness.notebook), transformers with
# accelerate and lightning (the training-framework callbacks,
# allocscope.integrations). Not needed by allocscope itself.
OPTIONAL_DEPS := ipython transformers accelerate lightning
# On the compat torch, for the scripts of real programs that depend on torch's
# version (tests/integration/test_process_forms.py: transformers imported
# first, accelerate launch).
COMPAT_OPTIONAL_DEPS := transformers accelerate

$(VENV)/.deps:
	$(PYTHON) -m venv $(VENV)
	$(PY) $(PIP_INSTALL) torch==$(TORCH) pybind11 ninja pytest numpy hypothesis setuptools wheel
	$(PY) $(PIP_INSTALL) $(OPTIONAL_DEPS) $(CONFORMANCE_DEPS)
	touch $@

$(VENV)/.built: $(VENV)/.deps $(SOURCES)
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	$(PY) tests/native/build.py
	touch $@

# The GPU machines run torch 2.11: build and test against it too, so that the
# version guards in csrc/ stay right. Skipped (with a warning) only when that
# torch cannot be downloaded, and never under CI=true.
test-compat:
	@if [ ! -f $(COMPAT_VENV)/.deps ]; then \
	  $(PYTHON) -m venv $(COMPAT_VENV) && \
	  $(COMPAT_VENV)/bin/python $(PIP_INSTALL) torch==$(COMPAT_TORCH) pybind11 ninja pytest numpy hypothesis setuptools wheel \
	  && $(COMPAT_VENV)/bin/python $(PIP_INSTALL) $(COMPAT_OPTIONAL_DEPS) \
	  && touch $(COMPAT_VENV)/.deps \
	  || { echo "WARNING: torch $(COMPAT_TORCH) could not be installed: compatibility build not tested"; \
	       [ "$$CI" != true ]; exit; }; \
	fi
	@if [ -f $(COMPAT_VENV)/.deps ]; then \
	  rm -rf build-compat && mkdir -p build-compat && cp -r setup.py pyproject.toml csrc python tests examples benchmarks docs build-compat/ && \
	  find build-compat -name '*.so' -delete && rm -rf build-compat/python/allocscope/vgpu/lib && \
	  cd build-compat && ../$(COMPAT_VENV)/bin/python -m pip install -q --no-build-isolation --no-deps -e . && \
	  ../$(COMPAT_VENV)/bin/python tests/native/build.py && \
	  { $(call PYTEST_SESSIONS,../$(COMPAT_VENV)/bin/python,-p no:cacheprovider,and not torch_agnostic $(COMPAT_EXCLUDE)); }; \
	fi

# A serving engine on the virtual GPU (tests/serving): vLLM in a venv of its
# own, with the torch it pins (vLLM 0.33.0: torch 2.14.0; about 9.5 GB and
# 3 minutes to install), allocscope built against that torch in
# build-serving/. Not part of make test.
SERVING_VENV := .venv-serving
SERVING_PIN ?= vllm==0.33.0
test-serving:
	@if [ ! -f $(SERVING_VENV)/.deps ]; then \
	  $(PYTHON) -m venv $(SERVING_VENV) && \
	  $(SERVING_VENV)/bin/python $(PIP_INSTALL) $(SERVING_PIN) pybind11 ninja pytest hypothesis setuptools wheel && \
	  touch $(SERVING_VENV)/.deps; \
	fi
	rm -rf build-serving && mkdir -p build-serving && cp -r setup.py pyproject.toml csrc python tests examples benchmarks docs build-serving/
	find build-serving -name '*.so' -delete && rm -rf build-serving/python/allocscope/vgpu/lib
	cd build-serving && ../$(SERVING_VENV)/bin/python -m pip install -q --no-build-isolation --no-deps -e . && \
	  ../$(SERVING_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/serving -m serving

# PyTorch's own tests (autograd; the CUDA memory tests on two virtual
# H100s) with allocscope off and on, test by test the same
# (tests/conformance/run.py): on each torch, PyTorch's tests fetched from
# Debian's source package (pinned, checked, cached outside the repository).
# Their own test dependencies (expecttest, psutil) go into the venvs. The
# compat torch's part needs build-compat (make test-compat). make test runs
# a fixed subset on the main torch (tests/integration/test_conformance.py),
# hence these in its venv too.
CONFORMANCE_DEPS := expecttest psutil
conformance: $(VENV)/.built
	$(PY) $(PIP_INSTALL) $(CONFORMANCE_DEPS)
	@$(PY) tests/conformance/run.py --out benchmarks/results/conformance_torch$(TORCH).json; status=$$?; \
	if [ -d build-compat ]; then \
	  $(COMPAT_VENV)/bin/python $(PIP_INSTALL) $(CONFORMANCE_DEPS) && \
	  (cd build-compat && ../$(COMPAT_VENV)/bin/python ../tests/conformance/run.py \
	    --out ../benchmarks/results/conformance_torch$(COMPAT_TORCH).json) || status=1; \
	else echo "conformance: no build-compat (make test-compat first): torch $(COMPAT_TORCH) not run"; status=1; fi; \
	exit $$status

# With a GPU, everything runs on it (the `cuda` and `gpu_hardware` tests
# included); without one, as `make test` does.
test-system:
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .
	$(PYTHON) tests/native/build.py
	@if $(PYTHON) -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then \
	  $(PYTHON) -m pytest -q tests; else $(call PYTEST_SESSIONS,$(PYTHON),); fi

# On a machine with a GPU and torch preinstalled, in one call: build, the
# whole suite on the GPU, the step benchmark, the fixtures recorded on the GPU
# and on the virtual GPU and compared; everything under $(GPU_CHECK_OUT)/.
gpu-check:
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .
	$(PYTHON) tests/native/build.py
	$(PYTHON) benchmarks/gpu_check.py --out $(GPU_CHECK_OUT) $(if $(GPU_CHECK_ARCHIVE),--archive $(GPU_CHECK_ARCHIVE)) $(GPU_CHECK_ARGS)

bench: $(VENV)/.built
	$(PY) benchmarks/bench_cpu_overhead.py
	$(PY) benchmarks/bench_load.py

clean:
	rm -rf build build-compat build-serving python/allocscope/_C*.so python/allocscope/_analysis*.so tests/native/*.so \
	  python/allocscope/vgpu/lib demo.alsc demo-cpu.alsc demo.html
