"""pytest plugin: run a test suite on allocscope's virtual GPU.

    pytest --vgpu H100-80GB                      # torch sees an H100; its real caching allocator runs
    pytest --vgpu A100-40GB --vgpu-memory 12GiB  # a smaller card
    ALLOCSCOPE_VGPU=2xH100-80GB pytest           # the same, from the environment

Installed with allocscope (entry point pytest11), so every suite in the
environment has the options; without them it does nothing. The virtual GPU
is switched on before pytest loads any conftest.py, so a conftest or test
module may import torch at its top; Python processes the tests start inherit
it. Tests that need real kernels (values, timing) should be skipped when
`allocscope.vgpu.active()`.
"""

from __future__ import annotations

import os

import pytest

from . import vgpu


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
