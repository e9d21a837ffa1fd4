"""make conformance's two lists (tests/conformance/): every line parses, and
a deselected test is chosen by suite and torch version alone."""

import fnmatch
import importlib.util
import os

import pytest

pytestmark = pytest.mark.torch_agnostic

_RUN = os.path.join(os.path.dirname(__file__), "..", "conformance", "run.py")
spec = importlib.util.spec_from_file_location("conformance_run", _RUN)
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)


def test_every_known_failure_names_a_suite_and_a_reason():
    known = run.known_failures()
    assert known and all(s and p and r for s, p, r in known)
    assert all(any(fnmatch.fnmatchcase(name, s) for name in run.SUITES) for s, _, _ in known)


def test_a_deselected_test_is_left_out_only_on_its_torches(tmp_path):
    path = tmp_path / "deselected.txt"
    path.write_text("# comment\ncuda_memory*\ttest_cuda.py::T::test_a\t2.11.*\tit ends the process\n")
    assert run.deselected("cuda_memory", "2.11.0+cu130", str(path)) == {"test_cuda.py::T::test_a": "it ends the process"}
    assert run.deselected("cuda_memory_expandable", "2.11.0", str(path)) == {"test_cuda.py::T::test_a": "it ends the process"}
    assert run.deselected("cuda_memory", "2.14.1+cu130", str(path)) == {}
    assert run.deselected("autograd", "2.11.0", str(path)) == {}


def test_the_shipped_deselections_parse_and_name_test_ids():
    tests = run.deselected("cuda_memory", "2.11.0")
    assert tests and all("::" in t and reason for t, reason in tests.items())
