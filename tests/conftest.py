"""Shared fixtures and markers.

`cuda` tests need a CUDA device: a GPU, or allocscope's virtual GPU
(`pytest --vgpu H100-80GB`, which `make test` runs them on), where torch's
real caching allocator runs. `gpu_hardware` tests need a physical GPU (kernel
results, timing): skipped on the virtual GPU. Everything else runs anywhere."""

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


def physical_gpu() -> bool:
    from allocscope import vgpu

    return _cuda_available() and not vgpu.active()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--failures-at-once", action="store_true",
                     help="print each failure's traceback as it happens, not only in the summary at the end "
                          "(benchmarks/gpu_check.py: a device call cut at its time limit still brings back "
                          "why a test failed)")


class _FailuresAtOnce:
    def __init__(self, terminal: pytest.TerminalReporter) -> None:
        self.terminal = terminal

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self.terminal.write_line("")
            self.terminal.write_line(f"--- {report.nodeid} ({report.when}) failed:")
            self.terminal.write_line(report.longreprtext)


@pytest.hookimpl(trylast=True)  # after the terminal reporter is registered
def pytest_configure(config: pytest.Config) -> None:
    terminal = config.pluginmanager.getplugin("terminalreporter")
    if config.getoption("--failures-at-once") and terminal is not None:
        config.pluginmanager.register(_FailuresAtOnce(terminal), "failures-at-once")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cuda, hardware = _cuda_available(), physical_gpu()
    for item in items:
        marker = item.get_closest_marker("gpu_hardware")
        if marker is not None and not hardware:
            reason = marker.args[0] if marker.args else marker.kwargs.get("reason", "")
            item.add_marker(pytest.mark.skip(reason=f"needs a physical GPU: {reason}"))
        elif "cuda" in item.keywords and not cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device (a GPU, or pytest --vgpu H100-80GB)"))


@pytest.fixture(scope="session")
def native():
    from allocscope.common.native import native as load

    return load()


@pytest.fixture(scope="session")
def harness():
    """The test-only native harness (csrc/testing/), which make test builds
    next to the tests (tests/native/build.py); never part of the package."""
    try:
        from tests.native import allocscope_testing
    except ImportError as e:
        pytest.fail(f"the test-only extension is not built ({e}): python tests/native/build.py")
    return allocscope_testing


@pytest.fixture
def fake_cuda(native, harness):
    """The test-only fake CUDA allocator installed as the current CUDA allocator."""
    if not native.built_with_cuda():
        pytest.skip("allocscope was built without CUDA support")
    if _cuda_available():
        pytest.skip("a CUDA device is present: the fake would replace its allocator")
    native.set_cuda_environment(harness.install_fake_cuda())
    harness.fake_set_limit(0)
    harness.fake_set_stream(0)
    harness.fake_empty_cache()
    harness.fake_reset_counters()
    yield harness
    harness.fake_set_limit(0)


def run_python(code: str, *args: str, timeout: float = 120, env: dict | None = None,
               cwd: str | None = None) -> subprocess.CompletedProcess:
    """Runs Python code in a fresh interpreter (a hang fails the test instead of CI)."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How many generated request streams the differential tests checked."""
    module = sys.modules.get("tests.integration.test_differential_cuda")
    checked = getattr(module, "CHECKED", None)
    if checked:
        terminalreporter.section("allocator model vs c10: generated streams checked")
        for setting, (streams, events, aborts) in checked.items():
            rerun = f" ({aborts} rerun after torch's own abort, docs/allocator.md)" if aborts else ""
            terminalreporter.write_line(f"{setting}: {streams} streams, {events} events{rerun}")
