"""PyTorch's own tests as ours (issues 49 and 62): make test's fixed subset
of `make conformance` (tests/conformance/run.py --subset), on the installed
torch. A few of PyTorch's autograd tests plain and under a watch, a few of
its CUDA memory tests on two virtual H100s with recording off, on, and
watching, and a few of its module tests (hooks, a load_state_dict that
swaps tensors) plain and with every module watched as it is built: every test's outcome and message the same in every mode (but
what known_differences.txt explains), every failure one known_failures.txt
explains, and every CUDA capture replayed exactly. The full run's counts
are in docs/benchmarks.md."""

import importlib.util
import json
import os
import subprocess
import sys
import urllib.error

import pytest

import allocscope

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "tests", "conformance", "run.py")

pytestmark = [pytest.mark.conformance,
              pytest.mark.skipif(not allocscope.vgpu.available(), reason="built without the virtual GPU")]


@pytest.fixture(scope="module")
def pytorch_tests():
    """PyTorch's test/ from Debian's source package (fetched once, checked,
    cached outside the repository)."""
    # what PyTorch's tests import (make test installs them: CONFORMANCE_DEPS)
    pytest.importorskip("expecttest", reason="PyTorch's tests need expecttest (pip install expecttest psutil)")
    spec = importlib.util.spec_from_file_location("allocscope_conformance_run", RUN)
    conformance = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conformance)
    try:
        return conformance.fetch(conformance.DEFAULT_SOURCE)
    except (urllib.error.URLError, OSError) as e:
        pytest.skip(f"PyTorch's tests could not be fetched from Debian ({e}): conformance not checked")


def test_pytorchs_own_tests_give_the_same_results_with_allocscope_off_recording_and_watching(pytorch_tests, tmp_path):
    out = tmp_path / "conformance.json"
    proc = subprocess.run([sys.executable, RUN, "--subset", "--out", str(out), "--keep", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=900)
    assert out.exists(), proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc["suites"]) == {"autograd", "cuda_memory", "module_hooks"}
    for name, suite in doc["suites"].items():
        for mode, m in suite["modes"].items():
            # each mode ran the subset, and most of it passed (a mode that
            # ran nothing, or failed everything, would compare equal)
            assert m["tests"] == suite["tests"] >= 5, (name, mode, m)
            assert m["counts"].get("passed", 0) >= suite["tests"] - 2, (name, mode, m)
        assert suite["differences"] == [], (name, suite["differences"])
        assert suite["failing_in_every_mode"]["unexplained"] == [], name
    captures = {path: r for m in doc["suites"]["cuda_memory"]["modes"].values()
                for path, r in (m.get("replays") or {}).items()}
    assert len(captures) >= 2  # recording's and watching's
    assert all(r["exact"] and r["events"] > 0 for r in captures.values()), captures
    assert proc.returncode == 0, proc.stderr[-3000:]
