# The two commands (README.md):
#   make demo   set up from a fresh clone, record a small training run, explain its peak
#   make test   set up from a fresh clone (Chromium from Debian for the HTML tests
#               included) and run the tests (.ci/run runs this)
#
# Set-up makes .venv with the pinned torch (a CUDA build, so the CUDA wrapper
# compiles here even without a GPU) and builds the extension in place.
# `make test-system` builds and tests against the python3 on PATH and its
# torch instead (e.g. a GPU machine with torch preinstalled and no network).

PYTHON ?= python3
TORCH ?= 2.14.1
VENV := .venv
PY := $(VENV)/bin/python
SOURCES := $(wildcard csrc/*.cpp csrc/*.h csrc/testing/*.cpp csrc/testing/*.h) setup.py
COMPAT_TORCH := 2.11.0
COMPAT_VENV := .venv-torch$(COMPAT_TORCH)

.PHONY: demo test test-main test-compat test-system browser bench clean

demo: $(VENV)/.built
	$(PY) -m allocscope run -f -o demo.alsc -- $(PY) examples/train.py --steps 3
	$(PY) -m allocscope info demo.alsc
	$(PY) -m allocscope report demo.alsc
	$(PY) -m allocscope html -f demo.alsc -o demo.html

test: browser test-main test-compat

test-main: $(VENV)/.built
	$(PY) -m pytest -q tests

# The HTML report's tests drive a headless Chromium from Debian's packages.
# Without one (no root, no package mirror) those tests are skipped, loudly.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo "sudo -n" ); \
	  $$SUDO apt-get install -y -q chromium >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null 2>&1 && $$SUDO apt-get install -y -q chromium >/dev/null 2>&1; } || \
	  echo "WARNING: Chromium could not be installed: the browser tests will be skipped"; }

$(VENV)/.deps:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==$(TORCH) pybind11 ninja pytest numpy setuptools wheel
	touch $@

$(VENV)/.built: $(VENV)/.deps $(SOURCES)
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

# The GPU machines run torch 2.11: build and test against it too, so that the
# version guards in csrc/ stay right. Skipped (with a warning) only when that
# torch cannot be downloaded.
test-compat:
	@if [ ! -f $(COMPAT_VENV)/.deps ]; then \
	  $(PYTHON) -m venv $(COMPAT_VENV) && \
	  $(COMPAT_VENV)/bin/python -m pip install -q torch==$(COMPAT_TORCH) pybind11 ninja pytest numpy setuptools wheel \
	  && touch $(COMPAT_VENV)/.deps \
	  || { echo "WARNING: torch $(COMPAT_TORCH) could not be installed: compatibility build not tested"; exit 0; }; \
	fi
	@if [ -f $(COMPAT_VENV)/.deps ]; then \
	  rm -rf build-compat && mkdir -p build-compat && cp -r setup.py pyproject.toml csrc python tests examples docs build-compat/ && \
	  find build-compat -name '*.so' -delete && \
	  cd build-compat && ../$(COMPAT_VENV)/bin/python -m pip install -q --no-build-isolation --no-deps -e . && \
	  ../$(COMPAT_VENV)/bin/python -m pytest -q tests -p no:cacheprovider; \
	fi

test-system:
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .
	$(PYTHON) -m pytest -q tests

bench: $(VENV)/.built
	$(PY) benchmarks/bench_cpu_overhead.py
	$(PY) benchmarks/bench_load.py

clean:
	rm -rf build build-compat python/allocscope/_C*.so demo.alsc demo.html
