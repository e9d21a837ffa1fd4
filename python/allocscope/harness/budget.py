"""GPU-memory budgets in a test suite: the `gpu_memory` marker of allocscope's
pytest plugin (pytest_plugin.py registers it; this module does the work).

    @pytest.mark.gpu_memory(gpu="A100-40GB", max_reserved="30GiB")
    def test_train_step(): ...

A marked test runs in a child pytest process on the virtual GPU of that card,
because the virtual GPU has to be on before torch loads its CUDA libraries and
the suite's own process may have loaded them (or a real GPU's) already. The
child records the test with allocscope from the start of its setup to the end
of its call, then fails it where torch's peak reserved or allocated memory
passed the budget, or where an allocation ran out of memory, with what filled
memory at the peak (the `fit` report's lines). Its reports come back to the
parent, which logs them as its own, so the test passes, fails and prints as
if it had run in place. A failed test's capture is kept for `allocscope
report`/`html`; a passed test's is removed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import pytest

from .. import vgpu
from ..common.errors import InputError
from ..common.units import format_bytes, parse_bytes
from ..recording.autostart import ENV_OPTIONS, ENV_OUTPUT
from ..recording.metadata import ENV_FIT

__all__ = ["Budget", "BudgetError", "ENV_CHILD", "budget_of", "child_spec", "judge", "run_protocol", "start_recording",
           "stop_recording", "write_report"]

ENV_CHILD = "ALLOCSCOPE_GPU_MEMORY_CHILD"  # JSON: what the child runs, where it writes, the budget
_KEYS = ("gpu", "memory", "max_reserved", "max_allocated", "routing", "compute")
_SIZES = ("memory", "max_reserved", "max_allocated")
_RECORDING = pytest.StashKey[Any]()


class BudgetError(InputError):
    """A gpu_memory marker that cannot be used as written."""


@dataclasses.dataclass(frozen=True)
class Budget:
    gpu: str
    memory: int | None = None  # the card's total memory, instead of the model's
    max_reserved: int | None = None
    max_allocated: int | None = None
    routing: str | None = None  # where an MoE router whose logits were not computed sends tokens (vgpu.activate)
    compute: str | None = None  # which ops compute their values on the virtual GPU

    def excess(self, reserved: int, allocated: int) -> list[str]:
        """The limits passed, as sentences; empty where the peaks are within them."""
        out = []
        for name, peak, limit in (("reserved", reserved, self.max_reserved),
                                  ("allocated", allocated, self.max_allocated)):
            if limit is not None and peak > limit:
                out.append(f"peak {name} {format_bytes(peak)} ({peak:,} bytes) > max_{name} "
                           f"{format_bytes(limit)} ({limit:,} bytes)")
        return out


def _size(name: str, value: Any) -> int | None:
    if value is None:
        return None
    try:
        n = value if isinstance(value, int) and not isinstance(value, bool) else parse_bytes(str(value))
    except ValueError as e:
        raise BudgetError(f"{name}: {e}") from None
    if n <= 0:
        raise BudgetError(f"{name}: {value!r} is not a positive size")
    return n


def budget_of(args: tuple[Any, ...], kwargs: dict[str, Any], session_gpu: str | None) -> Budget:
    """The budget a marker's arguments ask for: gpu (or the first positional
    argument; by default the session's virtual GPU), memory, max_reserved,
    max_allocated (sizes as bytes or text: 30GiB, 24GB), routing and compute
    (as vgpu.activate takes them)."""
    unknown = sorted(set(kwargs) - set(_KEYS))
    if unknown:
        raise BudgetError(f"unknown argument {unknown[0]!r}: gpu_memory takes {', '.join(_KEYS)}")
    if len(args) > 1 or (args and "gpu" in kwargs):
        raise BudgetError("gpu_memory takes one positional argument, the GPU")
    gpu = args[0] if args else kwargs.get("gpu") or session_gpu
    if not gpu:
        raise BudgetError("gpu_memory needs gpu=... (allocscope run --gpu list), or a session run with --vgpu GPU")
    try:
        devices = vgpu.parse_gpus(str(gpu))
    except vgpu.VirtualGpuError as e:
        raise BudgetError(str(e)) from None
    if len(devices) != 1:
        raise BudgetError(f"gpu_memory checks one device, not {gpu!r}")
    try:
        routing = str(vgpu.parse_routing(str(kwargs["routing"]))) if kwargs.get("routing") is not None else None
        compute = vgpu.parse_mode(str(kwargs["compute"])) if kwargs.get("compute") is not None else None
    except ValueError as e:
        raise BudgetError(str(e)) from None
    budget = Budget(str(gpu), *(_size(k, kwargs.get(k)) for k in _SIZES), routing=routing, compute=compute)
    if budget.max_reserved is None and budget.max_allocated is None:
        raise BudgetError("gpu_memory needs max_reserved=... or max_allocated=... (e.g. max_reserved=\"30GiB\")")
    return budget


# ---- the suite's process: run the test in a child, log its reports


def _report(item: pytest.Item, when: str, outcome: str, longrepr: str | None) -> pytest.TestReport:
    return pytest.TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, outcome, longrepr, when)


def run_protocol(item: pytest.Item) -> bool:
    """pytest_runtest_protocol for a marked test: runs it in a child process
    and logs the child's reports as the test's."""
    marker = item.get_closest_marker("gpu_memory")
    assert marker is not None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    try:
        budget = budget_of(marker.args, dict(marker.kwargs), os.environ.get(vgpu.ENV_GPU) if vgpu.active() else None)
    except BudgetError as e:
        reports = [_report(item, "setup", "failed", f"gpu_memory: {e}"), _report(item, "teardown", "passed", None)]
    else:
        reports = _run_child(item, budget)
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _child_command(item: pytest.Item) -> list[str]:
    config = item.config
    _, sep, inner = item.nodeid.partition("::")
    cmd = [sys.executable, "-m", "pytest", f"{item.path}{sep}{inner}", "-q", "-p", "no:cacheprovider",
           "--rootdir", str(config.rootpath), "-m", "", "-k", ""]  # the marker expression chose it already
    if config.inipath is not None:
        cmd += ["-c", str(config.inipath)]
    if config.pluginmanager.get_plugin("allocscope") is None:  # not loaded through the entry point
        cmd += ["-p", "allocscope.pytest_plugin"]
    if config.pluginmanager.has_plugin("xdist"):
        cmd += ["-n", "0"]  # one test: in the child itself
    return cmd


def _run_child(item: pytest.Item, budget: Budget) -> list[Any]:
    config = item.config
    workdir = tempfile.mkdtemp(prefix="allocscope-gpu-memory-")
    reports_path = os.path.join(workdir, "reports.jsonl")
    capture = os.path.join(workdir, "test.alsc")
    spec = {"nodeid_tail": item.nodeid.partition("::")[2], "reports": reports_path, "capture": capture,
            **dataclasses.asdict(budget)}
    # Not the settings of an `allocscope run` or `fit` the suite itself runs under.
    base = {k: v for k, v in os.environ.items() if k not in (ENV_OUTPUT, ENV_OPTIONS, ENV_FIT)}
    env = vgpu.environment(budget.gpu, memory=budget.memory, compute=budget.compute, routing=budget.routing,
                           base=base) | {ENV_CHILD: json.dumps(spec)}
    proc = subprocess.run(_child_command(item), cwd=config.invocation_params.dir, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace")
    reports = []
    if os.path.exists(reports_path):
        with open(reports_path) as f:
            reports = [config.hook.pytest_report_from_serializable(config=config, data=json.loads(line))
                       for line in f if line.strip()]
    if not any(r.when == "teardown" for r in reports):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        reports = [r for r in reports if r.when != "call"] + [_report(
            item, "call" if reports else "setup", "failed",
            f"gpu_memory: the child process that runs this test on the virtual {budget.gpu} exited with "
            f"status {proc.returncode} before reporting it; its output ends:\n{tail}")]
        reports.append(_report(item, "teardown", "passed", None))
    if all(r.passed for r in reports):
        shutil.rmtree(workdir, ignore_errors=True)
    return reports


# ---- the child: record the test, check the budget, write the reports


def child_spec(item: pytest.Item) -> dict[str, Any] | None:
    """What this child process checks, if it is one and item is its test."""
    text = os.environ.get(ENV_CHILD)
    if not text:
        return None
    spec = json.loads(text)
    return spec if item.nodeid.partition("::")[2] == spec["nodeid_tail"] else None


def start_recording(item: pytest.Item, spec: dict[str, Any]) -> None:
    from ..recording.session import Recording

    rec = item.stash[_RECORDING] = Recording(spec["capture"], device="cuda", stacks="python").start()
    rec.auto_watch()  # categories and modules in the message without a watch() in the test


def stop_recording(item: pytest.Item, reason: str = "stopped") -> None:
    rec = item.stash.get(_RECORDING, None)
    if rec is not None:
        rec.stop(reason)
        del item.stash[_RECORDING]


def judge(item: pytest.Item, spec: dict[str, Any], error: BaseException | None, report: Any) -> None:
    """Stops the recording and amends the call's report: failed, with the
    peaks and what filled memory, where the test ran out of memory or passed
    its budget; where it failed for its own reasons, the peaks and the
    capture beside its error. error: what the test raised, if anything."""
    import torch

    oom = isinstance(error, torch.OutOfMemoryError)
    stop_recording(item, "stopped" if error is None else f"exception: {type(error).__name__}")
    budget = Budget(**{k: spec[k] for k in _KEYS})
    reserved, allocated = torch.cuda.max_memory_reserved(0), torch.cuda.max_memory_allocated(0)
    peaks = f"peak reserved {format_bytes(reserved)}, peak allocated {format_bytes(allocated)}"
    if error is not None and not oom:
        if report.failed:  # its own error says why; the peaks go beside it
            report.sections.append(("Captured allocscope call",
                                    f"on the virtual {budget.gpu}: {peaks}; capture: {spec['capture']}"))
        return
    excess = budget.excess(reserved, allocated)
    if not excess and not oom:
        return
    card = f"the virtual {budget.gpu}" + (f" with {format_bytes(budget.memory)}" if budget.memory else "")
    if oom:
        head = f"ran out of GPU memory on {card} (torch.OutOfMemoryError; the post-mortem below says why)"
    else:
        head = f"over its GPU memory budget on {card}: " + "; ".join(excess)
    report.outcome = "failed"
    report.longrepr = "\n".join([head, "  " + peaks] + _breakdown(budget.gpu, spec["capture"]))


def _breakdown(gpu: str, path: str) -> list[str]:
    from ..capture.reader import CaptureError, load
    from ..reports.fit import card_lines, card_result

    try:
        card = card_result(gpu, 0, load(path), capture_path=path, top=5)
    except CaptureError as e:
        return [f"  (the capture could not be read: {e})"]
    return card_lines(card) if "peak" in card else []


def write_report(config: pytest.Config, report: Any, spec: dict[str, Any]) -> None:
    data = config.hook.pytest_report_to_serializable(config=config, report=report)
    with open(spec["reports"], "a") as f:
        f.write(json.dumps(data) + "\n")
