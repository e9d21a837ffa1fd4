"""pytest plugin: run a test suite on allocscope's virtual GPU, and hold tests
to a GPU-memory budget on a card the machine does not have.

    pytest --vgpu H100-80GB                      # torch sees an H100; its real caching allocator runs
    pytest --vgpu A100-40GB --vgpu-memory 12GiB  # a smaller card
    ALLOCSCOPE_VGPU=2xH100-80GB pytest           # the same, from the environment

    @pytest.mark.gpu_memory(gpu="A100-40GB", max_reserved="30GiB")
    def test_train_step(): ...                   # runs on a virtual A100 in a child process (budget.py)

Installed with allocscope (entry point pytest11), so every suite in the
environment has the options; without them it does nothing. The virtual GPU
is switched on before pytest loads any conftest.py, so a conftest or test
module may import torch at its top; Python processes the tests start inherit
it. Tests that need real kernels (values, timing) should be skipped when
`allocscope.vgpu.active()`.
"""

from __future__ import annotations

import os
from typing import Any, Generator

import pytest

from .. import vgpu
from . import budget

_MARKER = ("gpu_memory(gpu=None, max_reserved=None, max_allocated=None, memory=None, routing=None, compute=None): "
           "run the test on allocscope's virtual GPU of that card, in a child process, and fail it where torch's "
           "peak reserved or allocated memory passes the limit (sizes: bytes or text such as '30GiB') or where it "
           "runs out of memory; routing: where an MoE router whose logits were not computed sends tokens "
           "(balanced, balanced:F, worst, computed)")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("allocscope", "allocscope's virtual GPU")
    group.addoption("--vgpu", metavar="GPU", default=None,
                    help="run on a virtual GPU: H100-80GB, 2xA100-40GB, ... (allocscope run --gpu list)")
    group.addoption("--vgpu-memory", metavar="SIZE", default=None,
                    help="the virtual GPU's total memory instead of the model's (e.g. 24GiB)")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    options = early_config.known_args_namespace
    gpu = getattr(options, "vgpu", None) or os.environ.get(vgpu.ENV_GPU)
    if not gpu:
        return
    polls = os.environ.get(vgpu.ENV_EVENT_POLLS)
    try:
        vgpu.activate(gpu, memory=getattr(options, "vgpu_memory", None) or os.environ.get(vgpu.ENV_MEMORY),
                      context=os.environ.get(vgpu.ENV_CONTEXT), event_polls=int(polls) if polls else None)
    except (vgpu.VirtualGpuError, ValueError) as e:
        raise pytest.UsageError(f"--vgpu: {e}") from None


def pytest_report_header(config: pytest.Config) -> str | None:
    if not vgpu.active():
        return None
    memory = os.environ.get(vgpu.ENV_MEMORY)
    return (f"allocscope virtual GPU: {os.environ.get(vgpu.ENV_GPU)}"
            f"{f' with {int(memory):,} bytes' if memory else ''} (torch's real caching allocator; "
            f"kernels compute nothing)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", _MARKER)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    if item.get_closest_marker("gpu_memory") is None or budget.child_spec(item) is not None:
        return None  # unmarked, or this is the child that runs it: in place, under the hooks below
    return budget.run_protocol(item)


# Old-style hook wrappers (hookwrapper=True): an auto-loaded plugin must load
# under every pytest and pluggy a project may have.


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    spec = budget.child_spec(item)
    if spec is not None:
        budget.start_recording(item, spec)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    spec = budget.child_spec(item)
    if spec is None:
        return
    report = outcome.get_result()
    if call.when == "setup" and not report.passed:
        budget.stop_recording(item, "setup did not pass")
    elif call.when == "call":
        # The call's verdict, as pytest-memray's limit_memory gives its own.
        budget.judge(item, spec, call.excinfo.value if call.excinfo else None, report)
    budget.write_report(item.config, report, spec)  # for the parent, which logs it as its own
