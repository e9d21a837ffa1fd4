"""Large synthetic captures of a training loop, for benchmarks and for tests
of the reports at sizes no fixture reaches.

The loop looks like what `allocscope.record` + `rec.watch` write: a WATCH
annotation, labelled parameters, forward/backward/optimizer phases with
module scopes, saved activations, temporaries, gradients made in backward and
freed by zero_grad, Adam state made at the first step, and a mark per step.
On "cuda" the allocations go through the allocator model (allocscope.allocator)
so that addresses and segment events are what torch's caching allocator would
produce: a replay of the capture is exact. Steps after the second repeat the
second exactly, so the events of step 2..n are tiled with numpy and a capture
of 10 million events takes seconds to write.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from allocscope.capture import format as F
from allocscope.allocator.blocks import BumpAddresses
from allocscope.allocator.config import AllocatorConfig
from allocscope.allocator.model import DeviceAllocator
from allocscope.allocator.state import segments
from allocscope.capture.writer import CaptureWriter

__all__ = ["training_run"]

K = F.EventKind
_SEGMENT_KINDS = {"segment_alloc": K.SEGMENT_ALLOC, "segment_free": K.SEGMENT_FREE,
                  "segment_map": K.SEGMENT_MAP, "segment_unmap": K.SEGMENT_UNMAP}
GiB = 1 << 30


class _Loop:
    def __init__(self, b: CaptureWriter, dev: DeviceAllocator, stream: int, layers: int, hidden: int, batch: int):
        self.b, self.dev, self.stream = b, dev, stream
        self.layers, self.hidden, self.batch = layers, hidden, batch
        self.blocks: dict[int, Any] = {}
        self.opt_state: list[int] = []

    def stack(self, *inner: tuple[str, str, int]) -> int:
        return self.b.stack(list(inner) + [("train.py", "main", 88)])

    def alloc(self, size: int, stack: int, label: tuple[int, str] | None = None) -> int:
        n = len(self.dev.events)
        blk = self.dev.malloc(size, 0)
        assert blk is not None
        for s in self.dev.events[n:]:
            self.b.event(_SEGMENT_KINDS[s.kind], addr=s.addr, size=s.size, stream=self.stream, dt=200)
        self.blocks[blk.addr] = blk
        self.b.alloc(blk.addr, size, stack=stack, stream=self.stream, arg=300, dt=700)
        if label:
            self.b.annotate(label[0], label[1], addr=blk.addr, size=size, dt=100)
        return blk.addr

    def free(self, addr: int) -> None:
        self.dev.free(self.blocks.pop(addr))
        self.b.free(addr, dt=500, stream=F.NO_STREAM if self.stream != F.CPU_STREAM else F.CPU_STREAM)

    def params(self) -> list[int]:
        s = self.stack(("model.py", "Model.__init__", 21), ("train.py", "build", 30))
        out = []
        for i in range(self.layers):
            for name, size in (("weight", self.hidden * self.hidden * 4), ("bias", self.hidden * 4)):
                out.append(self.alloc(size, s, (K.PARAMETER, f"layers.{i}.{name}")))
        return out

    def step(self, k: int, params: list[int]) -> None:
        b, h, n = self.b, self.hidden, self.batch
        act = n * h * 4
        b.annotate(K.PHASE, "forward", addr=k)
        x = self.alloc(act, self.stack(("train.py", "batch", 40), ("train.py", "train", 60)), (K.INPUT, "Model.input[0]"))
        saved = []
        for i in range(self.layers):
            b.annotate(K.MODULE_ENTER, f"layers.{i}", addr=2)
            line = ("model.py", "Block.forward", 30)
            fwd = self.stack(("torch/nn/functional.py", "linear", 2100), line, ("model.py", "Model.forward", 50),
                             ("train.py", "train", 62))
            y = self.alloc(act, fwd, (K.ACTIVATION, f"layers.{i}"))
            t = self.alloc(act * 2, self.stack(("model.py", "Block.forward", 31), ("model.py", "Model.forward", 50),
                                       ("train.py", "train", 62)))
            self.free(t)
            saved.append(y)
            b.annotate(K.MODULE_EXIT, f"layers.{i}", addr=2)
        b.annotate(K.PHASE, "backward", addr=k)
        grads = []
        bwd = self.stack(("train.py", "train", 64))
        g_in = self.alloc(act, bwd)
        for i in reversed(range(self.layers)):
            b.annotate(K.MODULE_ENTER, f"layers.{i}", addr=3)
            for j, name in ((0, "weight"), (1, "bias")):
                size = h * h * 4 if j == 0 else h * 4
                grads.append(self.alloc(size, bwd, (K.GRADIENT, f"layers.{i}.{name}")))
            g_next = self.alloc(act, bwd)
            self.free(g_in)
            self.free(saved.pop())
            g_in = g_next
            b.annotate(K.MODULE_EXIT, f"layers.{i}", addr=3)
        self.free(g_in)
        self.free(x)
        b.annotate(K.PHASE, "optimizer", addr=k)
        opt = self.stack(("torch/optim/adam.py", "_single_tensor_adam", 400), ("train.py", "train", 65))
        if k == 0:
            for i in range(self.layers):
                for name, size in (("weight", h * h * 4), ("bias", h * 4)):
                    for key in ("exp_avg", "exp_avg_sq"):
                        self.opt_state.append(self.alloc(size, opt, (K.OPTIMIZER_STATE, f"layers.{i}.{name}/{key}")))
        for _ in range(self.layers):
            t = self.alloc(h * h * 4, opt)
            self.free(t)
        b.annotate(K.PHASE, "other", addr=k + 1)
        for g in grads:  # zero_grad(set_to_none=True)
            self.free(g)
        b.mark(f"step {k}")


def _columns(rows: list[tuple[int, ...]]) -> dict[str, np.ndarray]:
    arr = np.array(rows, dtype=object)
    return {c: arr[:, i].astype(np.uint64 if c == "addr" else np.int64) for i, c in enumerate(F.COLUMNS)}


def training_run(path: str, events: int, *, device: str = "cuda", layers: int = 24, hidden: int = 1024,
                 batch: int = 512, events_per_chunk: int = 65536, metadata: dict[str, Any] | None = None,
                 set_up: int = 0) -> dict[str, Any]:
    """Writes a capture of about `events` events; returns what it holds.
    metadata: more of it; set_up: marks (a second apart) before the first
    allocation, as the set-up of a script allocates nothing."""
    cuda = device == "cuda"
    total = 80 * GiB
    meta = {"synthetic": True, "torch": "synthetic", "devices_recorded": [device],
            "start_monotonic_ns": 1_000_000, **(metadata or {})}
    b = CaptureWriter(meta, device=0 if cuda else -1)
    stream = b.default_stream
    dev = DeviceAllocator(AllocatorConfig(), device=0, total=total, addresses=BumpAddresses(0x7F0000000000))
    if cuda:
        b.baseline({"label": "start", "device_type": "cuda", "seq": 0, "segments": [],
                    "config": {"max_split_size": (1 << 64) - 1, "garbage_collection_threshold": 0.0,
                               "expandable_segments": False, "last_allocator_settings": "",
                               "roundup_power2_divisions": [0] * 16},
                    "devices": [{"index": 0, "total": total, "free": total - 500 * (1 << 20),
                                 "used": 500 * (1 << 20), "memory_fraction": 1.0}]})
    loop = _Loop(b, dev, stream, layers, hidden, batch)
    watch = {"name": "Model", "parameters": layers * (hidden * hidden + hidden) * 4, "trainable": True,
             "buffers": 0, "optimizer": {"type": "Adam", "state_per_parameter": 2}}
    for i in range(set_up):
        b.mark(f"set-up {i}", dt=1_000_000_000)
    b.annotate(K.WATCH, json.dumps(watch))
    params = loop.params()
    loop.step(0, params)
    loop.step(1, params)
    head = b.n_events
    loop.step(2, params)
    per_step = b.n_events - head
    template = _columns(b.events[-per_step:])
    steps = max(3, (events - head) // per_step + 1)
    # Steps 3.. repeat step 2: same requests, same allocator state, so the
    # same addresses; only times, the iteration numbers and the marks move.
    reps = steps - 3
    if reps > 0:
        phase = template["kind"] == K.PHASE
        mark = template["kind"] == K.MARK
        span = int(template["time"][-1] - template["time"][0]) + 1000
        k = np.repeat(np.arange(3, steps), per_step)
        tiled = {c: np.tile(v, reps) for c, v in template.items()}
        tiled["time"] = tiled["time"] + (k - 2) * span
        tiled["addr"] = np.where(np.tile(phase, reps), tiled["addr"].astype(np.int64) + (k - 2), tiled["addr"]
                                 ).astype(np.uint64)
        mark_ids = np.array([b.string(f"step {i}") for i in range(3, steps)], np.int64)
        tiled["arg"] = np.where(np.tile(mark, reps), mark_ids[k - 3], tiled["arg"])
        b.extend(**tiled)
    if cuda:
        b.baseline({"label": "end", "device_type": "cuda", "seq": b.n_events, "segments": [seg.to_baseline() for seg in segments(dev)],
                    "config": b.baselines[0]["config"], "devices": b.baselines[0]["devices"]})
    b.write(path, events_per_chunk=events_per_chunk)
    return {"events": b.n_events, "steps": steps, "per_step": per_step, "device": device}
