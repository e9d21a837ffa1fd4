"""The stack walker reads a thread's own frames without the GIL. Check it
against traceback and the public API, on every CPython 3.10+ on this machine
(it declares each version's frame layout), with the GIL released, in threads
and generators. Builds a torch-free harness module with each interpreter."""

import glob
import os
import shutil
import subprocess
import sys

import pytest

from ..conftest import ROOT

pytestmark = pytest.mark.torch_agnostic

CHECK = r'''
import sys, threading
import _pystack_harness as h

def expected():
    out = []
    f = sys._getframe(1)
    while f is not None:  # qualified names, as the walker reports them (3.11+)
        code = f.f_code
        out.append((code.co_filename, getattr(code, "co_qualname", code.co_name), f.f_lineno))
        f = f.f_back
    return out

def inner(depth):
    if depth:
        return inner(depth - 1)
    here = expected()
    return (h.self_check(), here, h.walk(True, True), h.walk(True, False), h.walk(False, False))

def gen():
    yield inner(3)

def check(result):
    (ok, why), here, released, held, public = result
    assert ok or not compiled, why
    assert released == public == held, (released, public)
    # The innermost line differs (expected() is called on another line).
    assert [f[:2] for f in released] == [f[:2] for f in here]
    assert released[1:] == here[1:]

compiled = h.internal_walker_compiled()
check(next(gen()))
out = []
t = threading.Thread(target=lambda: out.append(inner(2)))
t.start(); t.join()
check(out[0])
print("ok", sys.version_info[:2], "internal" if compiled else "gil-only")
'''


def _interpreters():
    found = {}
    candidates = [sys.executable]
    candidates += [shutil.which(f"python3.{m}") for m in range(10, 15)]
    for root in (os.path.expanduser("~/.pyenv/versions"), "/root/.pyenv/versions"):
        candidates += sorted(glob.glob(os.path.join(root, "3.*", "bin", "python3")))
    for exe in filter(None, candidates):
        try:
            out = subprocess.run([exe, "-c", "import sys, sysconfig, os; v=sys.version_info; "
                                  "print(v[0], v[1], os.path.isfile(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"],
                                 capture_output=True, text=True, timeout=30)
            major, minor, has_headers = out.stdout.split()
        except (OSError, ValueError, subprocess.SubprocessError):
            continue
        if int(major) == 3 and int(minor) >= 10 and has_headers == "True":
            found.setdefault((int(major), int(minor)), exe)
    return [pytest.param(exe, id=f"py{v[0]}.{v[1]}") for v, exe in sorted(found.items())]


@pytest.mark.parametrize("python", _interpreters())
def test_walker_matches_traceback_without_the_gil(python, tmp_path):
    if shutil.which("g++") is None:
        pytest.skip("no C++ compiler")
    cfg = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['include']); "
                          "print(sysconfig.get_config_var('EXT_SUFFIX'))"], capture_output=True, text=True, check=True)
    include, suffix = cfg.stdout.split()
    module = tmp_path / f"_pystack_harness{suffix}"
    subprocess.run(["g++", "-O1", "-std=c++17", "-shared", "-fPIC", f"-I{include}", f"-I{os.path.join(ROOT, 'csrc')}",
                    os.path.join(ROOT, "csrc", "recorder", "pystack.cpp"),
                    os.path.join(ROOT, "csrc", "testing", "pystack_harness.cpp"), "-o", str(module)],
                   check=True, capture_output=True, timeout=300)
    result = subprocess.run([python, "-c", CHECK], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


def test_walker_in_the_extension_passes_its_self_check(harness, tmp_path):
    """The walker's source built as torch builds extensions passes its
    self-check (the tests' harness), and the recorder, which chooses its
    walker by that check, chose the internal one (the capture says so)."""
    import torch

    import allocscope

    ok, why = harness.pystack_self_check()
    path = tmp_path / "walker.alsc"
    with allocscope.record(path, device="cpu"):
        torch.empty(16)
    chosen = allocscope.load(path).metadata["recorder"]["stack_walker"]
    if sys.version_info >= (3, 11):
        assert ok, why
        assert chosen == "internal", chosen
