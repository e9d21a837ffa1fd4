"""Record what cuDNN asks torch for on this card: the rows of the virtual GPU's
cuDNN tables (csrc/vgpu/cudnn_tables.h, allocscope/vgpu/cudnn_tables.tsv).

    python benchmarks/cudnn_tables.py --out rows.tsv [--models resnet50,convnext,unet] [--batch 8,32]

On a card (make gpu-check runs it), for every convolution and batch norm the
models' training steps run (as torch calls them: fp32 and bf16 autocast), it
calls the same ATen op alone, recorded by allocscope, and writes one row per
problem and direction: the bytes torch asked the caching allocator for and
gave back within the call (the workspace), or, for batch norm's reserve
space, what it kept. --batch takes several sizes, so that the tables' rule
for unrecorded batch sizes (the nearest one, scaled) can be measured:
--json prints that rule's error on the rows recorded here.

On the virtual GPU it reads back what the tables say (the stand-in answers
from them): tests/integration/test_cudnn.py records a table there and checks
that it reads back as written. The problem key is built here as the stand-in
builds it (problem_key, conv_key in csrc/vgpu/cudnn_tables.cpp).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import model_zoo  # noqa: E402

aten = torch.ops.aten
DTYPES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 9}  # cudnnDataType_t
BN_PER_ACTIVATION, BN_SPATIAL, BN_SPATIAL_PERSISTENT = 0, 1, 2  # cudnnBatchNormMode_t


def _join(v: Any) -> str:
    return ",".join(str(int(x)) for x in v)


def _layout(t: torch.Tensor) -> str:
    return "nhwc" if t.dim() >= 3 and t.shape[1] > 1 and t.stride(1) == 1 else "nchw"


def _strictly(t: torch.Tensor, memory_format: torch.memory_format) -> bool:
    """Laid out in this format and not also plain contiguous (torch's
    suggest_memory_format, which Python does not expose)."""
    return t.is_contiguous(memory_format=memory_format) and not t.is_contiguous()


def _cudnn_format(x: torch.Tensor, w: torch.Tensor) -> torch.memory_format:
    """The memory format torch gives cuDNN's convolution tensors
    (cudnn_conv_suggest_memory_format, aten/src/ATen/native/ConvUtils.h)."""
    for channels_last, dim in ((torch.channels_last, 4), (torch.channels_last_3d, 5)):
        if x.dim() == dim and (_strictly(x, channels_last) or _strictly(w, channels_last)):
            return channels_last
    return torch.contiguous_format


def conv_key(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, padding: Any, stride: Any, dilation: Any) -> str:
    """The key the stand-in builds from the tensors cuDNN is given: in the
    memory format torch converts them to."""
    layout = _layout(x.contiguous(memory_format=_cudnn_format(x, w)))
    return (f"dt={DTYPES[x.dtype]} {layout} x={_join(x.shape[1:])} w={_join(w.shape)} y={_join(y.shape[1:])} "
            f"pad={_join(padding)} stride={_join(stride)} dil={_join(dilation)}")


def bn_key(x: torch.Tensor, mode: int) -> str:
    dims = list(x.shape) + [1] * max(0, 4 - x.dim())
    return f"dt={DTYPES[x.dtype]} {_layout(x)} mode={mode} x={_join(dims[1:])}"


class _Problems(TorchDispatchMode):
    """The convolutions and batch norms a training step runs, as (op, args)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, tuple] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if func is aten.convolution.default and not args[6]:  # transposed convolutions: not recorded yet
            x, w, _, stride, padding, dilation, _, _, groups = args
            self.seen.setdefault(f"conv {conv_key(x, w, out, padding, stride, dilation)} g={groups}",
                                 ("conv", _spec(x), _spec(w), _spec(out), list(stride), list(padding),
                                  list(dilation), groups))
        elif func is aten.cudnn_batch_norm.default and args[5]:  # training
            x = args[0]
            self.seen.setdefault(f"bn {bn_key(x, 0)} {args[1].dtype}", ("bn", _spec(x), args[1].dtype))
        return out


def _spec(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.dtype, t.dim() == 4 and _strictly(t, torch.channels_last)


def _make(spec: tuple, batch: int) -> torch.Tensor:
    shape, dtype, channels_last = spec
    t = torch.randn((batch, *shape[1:]), device="cuda", dtype=dtype)
    return t.contiguous(memory_format=torch.channels_last) if channels_last else t


def collect(models: list[str], batch: int) -> list[tuple]:
    """The problems of one training step of each model, fp32 and bf16 autocast."""
    found: dict[str, tuple] = {}
    for name in models:
        for amp in (None, torch.bfloat16):
            torch.manual_seed(0)
            with torch.device("cuda"):
                model, make_batch, loss_fn = model_zoo.build(name, "plain")
            mode = _Problems()
            with mode, torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None):
                loss_fn(model, make_batch(2, torch.device("cuda"))).backward()
            found.update(mode.seen)
            del model
    return list(found.values())


def _calls(problem: tuple, batch: int) -> list[tuple[str, str, Callable[[], Any], str]]:
    """(op, key, call, what) per direction: what is "workspace" (freed in
    the call) or "kept" (the call's 4th result: batch norm's reserve)."""
    if problem[0] == "conv":
        _, xs, ws, ys, stride, padding, dilation, groups = problem
        x, w, gy = _make(xs, batch), _make(ws, ws[0][0]), _make(ys, batch)
        key = conv_key(x, w, gy, padding, stride, dilation)
        zeros = [0] * len(stride)

        def bwd(mask: list[bool]) -> Callable[[], Any]:
            return lambda: aten.convolution_backward(gy, x, w, None, stride, padding, dilation, False, zeros, groups,
                                                     mask)
        return [("conv_fprop", key, lambda: aten.convolution(x, w, None, stride, padding, dilation, False, zeros,
                                                              groups), "workspace"),
                ("conv_dgrad", key, bwd([True, False, False]), "workspace"),
                ("conv_wgrad", key, bwd([False, True, False]), "workspace")]
    _, xs, wdtype = problem
    x = _make(xs, batch)
    c = x.shape[1]
    weight, bias = torch.ones(c, device="cuda", dtype=wdtype), torch.zeros(c, device="cuda", dtype=wdtype)
    rm, rv = torch.zeros(c, device="cuda", dtype=wdtype), torch.ones(c, device="cuda", dtype=wdtype)
    persistent = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    mode = BN_PER_ACTIVATION if x.dim() == 2 else BN_SPATIAL_PERSISTENT if persistent else BN_SPATIAL
    key = bn_key(x, mode)
    gy = torch.ones_like(x)
    state: dict[str, Any] = {}

    def fwd() -> Any:
        state["out"] = aten.cudnn_batch_norm(x, weight, bias, rm, rv, True, 0.1, 1e-5)
        return state["out"]

    def back() -> Any:
        _, mean, var, reserve = state["out"]
        return aten.cudnn_batch_norm_backward(x, gy, weight, rm, rv, mean, var, 1e-5, reserve)
    return [("bn_fwd_ws", key, fwd, "workspace"), ("bn_reserve", key, lambda: state["out"], "kept"),
            ("bn_bwd_ws", key, back, "workspace")]


def measure(problems: list[tuple], batches: list[int]) -> list[dict[str, Any]]:
    """Runs each call alone between two marks of one recording and reads
    back what it asked for (exact requested bytes, from the capture)."""
    import allocscope
    from allocscope.attribution.workspaces import library_allocation
    from allocscope.attribution.ops import op_names
    from allocscope.capture.format import EventKind

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cudnn.alsc")
        calls = []
        with allocscope.record(path, device="cuda", ops=True):  # the call's op names its workspace
            for batch in batches:
                for problem in problems:
                    for op, key, call, what in _calls(problem, batch):
                        allocscope.mark(f"call {len(calls)}")
                        # The call's results live until after the next mark:
                        # only what the call itself gave back is inside.
                        result = call()
                        kept = (result[3].numel() * result[3].element_size()) if what == "kept" else 0
                        torch.cuda.synchronize()
                        calls.append((op, batch, key, what, kept))
            allocscope.mark(f"call {len(calls)}")
        cap = allocscope.load(path)
        ev = cap.events
        marks = [i for i in range(len(ev)) if ev.kind[i] == EventKind.MARK]
        # Only what the cuDNN op asks for itself, not the copies torch makes
        # inside it to the layout cuDNN is given.
        names = op_names(cap, ev.op)
        own = {op for op, name in names.items() if library_allocation(name.chain)}
        for (op, batch, key, what, kept), lo, hi in zip(calls, marks[:-1], marks[1:], strict=True):
            live: dict[int, int] = {}
            freed = 0
            for i in range(lo, hi):
                if ev.kind[i] == EventKind.ALLOC and int(ev.op[i]) in own:
                    live[int(ev.addr[i])] = int(ev.size[i])
                elif ev.kind[i] == EventKind.FREE and int(ev.addr[i]) in live:
                    freed = max(freed, live.pop(int(ev.addr[i])))
            rows.append({"op": op, "batch": batch, "key": key, "bytes": kept if what == "kept" else freed})
    # One row per (op, batch, key): a problem two models share is one row.
    return list({(r["op"], r["batch"], r["key"]): r for r in rows}.values())


def scaling_error(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The tables' rule for an unrecorded batch size, tried on these rows:
    each row predicted from the same problem's row at the nearest other batch
    size, scaled (cudnn_tables.h)."""
    by_key: dict[tuple[str, str], dict[int, int]] = {}
    for r in rows:
        by_key.setdefault((r["op"], r["key"]), {})[r["batch"]] = r["bytes"]
    errors = []
    for sizes in by_key.values():
        for b, actual in sizes.items():
            others = [o for o in sizes if o != b]
            if not others:
                continue
            near = min(others, key=lambda o: abs(o - b))
            predicted = -(-sizes[near] * b // near // 512) * 512 if sizes[near] else 0
            errors.append(predicted - actual)
    total = sum(r["bytes"] for r in rows)
    return {"predictions": len(errors), "exact": sum(e == 0 for e in errors),
            "mean_abs_error_bytes": sum(abs(e) for e in errors) / max(1, len(errors)),
            "max_abs_error_bytes": max((abs(e) for e in errors), default=0), "bytes_recorded": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the rows, tab-separated, as cudnn_tables.tsv holds them")
    parser.add_argument("--models", default=",".join(model_zoo.CONV_MODELS))
    parser.add_argument("--batch", default="8,32", help="batch sizes, comma-separated")
    parser.add_argument("--json", action="store_true", help="print a summary as JSON")
    a = parser.parse_args()
    if not torch.cuda.is_available() or not torch.backends.cudnn.is_available():
        sys.exit("cudnn_tables.py: needs CUDA and cuDNN")
    models = [m for m in a.models.split(",") if m]
    unknown = [m for m in models if m not in model_zoo.MODELS]
    if unknown:
        sys.exit(f"cudnn_tables.py: unknown model(s) {', '.join(unknown)}: one of {', '.join(model_zoo.MODELS)}")
    batches = [int(b) for b in a.batch.split(",")]
    problems = collect(models, batches[0])
    rows = measure(problems, batches)
    card, version = torch.cuda.get_device_name(), torch.backends.cudnn.version()
    with open(a.out, "w") as f:
        for r in rows:
            f.write(f"{card}\t{version}\t{r['op']}\t{r['batch']}\t{r['key']}\t{r['bytes']}\n")
    if a.json:
        print(json.dumps({"card": card, "cudnn": version, "torch": torch.__version__, "models": models,
                          "batches": batches, "problems": len(problems), "rows": len(rows),
                          "nonzero_rows": sum(r["bytes"] > 0 for r in rows),
                          "scaling_rule": scaling_error(rows)}))


if __name__ == "__main__":
    main()
