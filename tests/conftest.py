"""Shared fixtures. GPU tests carry the `cuda` marker and are skipped where
torch sees no GPU; everything else runs anywhere."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def native():
    from allocscope._native import native as load

    return load()


@pytest.fixture
def fake_cuda(native):
    """The test-only fake CUDA allocator installed as the current CUDA allocator."""
    if not native.built_with_cuda():
        pytest.skip("allocscope was built without CUDA support")
    if _cuda_available():
        pytest.skip("a real GPU is present: the fake would replace its allocator")
    native._testing.install_fake_cuda()
    native._testing.fake_set_limit(0)
    native._testing.fake_set_stream(0)
    native._testing.fake_empty_cache()
    native._testing.fake_reset_counters()
    yield native._testing
    native._testing.fake_set_limit(0)


def run_python(code: str, *args: str, timeout: float = 120, env: dict | None = None,
               cwd: str | None = None) -> subprocess.CompletedProcess:
    """Runs Python code in a fresh interpreter (a hang fails the test instead of CI)."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)
