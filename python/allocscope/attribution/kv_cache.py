"""Which allocations are a KV cache (the keys and values an inference
engine keeps between decoding steps), and which are a serving engine's own
buffers. Nothing labels them at run time; the libraries that make them are
recognised by where they allocate, so that a script needs no change.

KV caches:

- Hugging Face transformers: every Cache class (dynamic, static,
  sliding-window, quantized, offloaded, ...) lives in
  transformers/cache_utils.py, and grows or fills its layers there;
- vLLM: its model runners allocate the KV cache blocks in methods named
  after it (`_allocate_kv_cache_tensors`, `initialize_kv_cache_tensors`,
  and the older `CacheEngine._allocate_kv_cache`);
- SGLang: its token-to-KV pools (`MHATokenToKVPool`, `MLATokenToKVPool`,
  ...) in sglang/srt/mem_cache/.

A cache's own temporaries (a quantized cache's dequantized keys, freed
before the model call that made them returned) stay temporaries. (Not the
phase rule's temporaries: a generation's steps are calls of one forward
phase, and a dynamic cache's layers are freed a step later, in the same
phase.)

A serving engine's own buffers (vLLM's, SGLang's): what the engine's code
allocates for itself outside its model, which is neither weights nor KV
cache: input ids and positions, block tables, sampling and logits state,
structured-output bitmasks. Their user frame is in the engine's package,
outside its model code (vllm/model_executor/, sglang/srt/layers/ and
sglang/srt/models/ make the weights and the model's intermediates; the
compiled model's code is Inductor's, under ~/.cache/vllm/), and they are
not made inside a watched model call."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..capture.format import MODULE_BACKWARD, EventKind
from ..capture.reader import Capture
from ..capture.stacks import is_library
from .lifetimes import lifetimes

__all__ = ["engine_rows", "engine_site", "kv_cache_allocations", "kv_cache_rows", "kv_cache_site", "kv_cache_stacks",
           "model_calls"]


def kv_cache_site(filename: str, function: str) -> bool:
    """Whether a frame is one of the libraries' KV cache allocations (module docstring)."""
    path = filename.replace("\\", "/")
    if path.endswith("transformers/cache_utils.py"):
        return True
    if "/vllm/" in path and "kv_cache" in function:
        return True
    return "/sglang/srt/mem_cache/" in path and "KVPool" in function


def engine_site(filename: str, function: str) -> bool:
    """Whether a frame is a serving engine's own code outside its model (module docstring)."""
    path = filename.replace("\\", "/")
    if "torch_compile_cache" in path or "inductor" in path:
        return False  # the model's code, compiled (vLLM keeps it under ~/.cache/vllm/)
    if "/vllm/" in path:
        return "/vllm/model_executor/" not in path
    return "/sglang/srt/" in path and "/sglang/srt/layers/" not in path and "/sglang/srt/models/" not in path


def kv_cache_stacks(cap: Capture) -> np.ndarray:
    """Per stack node: whether the stack's user frame (its innermost frame
    outside torch and allocscope: capture/stacks.py) is a KV cache site.
    (Not any frame: vLLM's engine sizes, warms up and captures its CUDA
    graphs inside `_initialize_kv_caches`.)"""
    return user_frame_stacks(cap, kv_cache_site)


def user_frame_stacks(cap: Capture, predicate: Any) -> np.ndarray:
    """Per stack node: whether predicate(filename, function) holds for the
    stack's user frame (its innermost frame outside torch and allocscope)."""
    n = len(cap.stack_parent)
    if n == 0:
        return np.zeros(0, bool)
    frames = cap.stack_frame.astype(np.int64)
    present = np.unique(frames[1:]).tolist() if n > 1 else []
    files = {f: cap.strings[cap.frame_file[f]] for f in present}
    site = {f for f in present if predicate(files[f], cap.strings[cap.frame_function[f]])}
    library = np.isin(frames, np.array([f for f in present if is_library(files[f])], np.int64))
    library[0] = False  # node 0: the empty stack
    flag = np.isin(frames, np.array(sorted(site), np.int64)) & ~library
    flag[0] = False
    if not flag.any():
        return flag
    parent = cap.stack_parent.astype(np.int64)
    # A library frame's node answers as its caller's: a fixpoint over the
    # tree (as many rounds as the longest run of library frames).
    while True:
        grown = np.where(library, flag[parent], flag)
        if np.array_equal(grown, flag):
            return flag
        flag = grown


def kv_cache_rows(cap: Capture, stack: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per row (its stack node, ALLOC and FREE events): whether a KV cache
    site allocated it to keep: not a temporary freed before the model call
    that made it returned."""
    in_cache = kv_cache_stacks(cap)
    stack = stack.astype(np.int64)
    if not in_cache.any():
        return np.zeros(len(stack), bool)
    made = _flagged(in_cache, stack)
    first, last = model_calls(cap)
    call = np.searchsorted(first, start, side="right") - 1
    inside = (call >= 0) & (start < last[np.maximum(call, 0)]) if len(first) else np.zeros(len(start), bool)
    freed_inside = inside & (end < last[np.maximum(call, 0)]) if len(first) else inside
    return made & ~freed_inside


def _flagged(flags: np.ndarray, stack: np.ndarray) -> np.ndarray:
    """Per row: whether its stack node is flagged (a node past the table: no)."""
    return flags[np.clip(stack, 0, len(flags) - 1)] & (stack < len(flags))


def kv_cache_allocations(cap: Capture, event: int) -> list[int]:
    """The ALLOC events of a library's KV cache live after event `event`."""
    in_cache = kv_cache_stacks(cap)
    if not in_cache.any():
        return []
    lt = lifetimes(cap.events)
    made = _flagged(in_cache, cap.events.stack[lt.alloc].astype(np.int64))
    live = (lt.alloc <= event) & ((lt.free < 0) | (lt.free > event))
    return lt.alloc[made & live].tolist()


def engine_rows(cap: Capture, stack: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Per row (its stack node and ALLOC event): whether a serving engine's
    own code allocated it outside a watched model call (module docstring)."""
    by_engine = user_frame_stacks(cap, engine_site)
    stack = stack.astype(np.int64)
    if not by_engine.any():
        return np.zeros(len(stack), bool)
    made = _flagged(by_engine, stack)
    first, last = model_calls(cap)
    if not len(first):
        return made
    call = np.searchsorted(first, start, side="right") - 1
    return made & ~((call >= 0) & (start < last[np.maximum(call, 0)]))


def model_calls(cap: Capture) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) events of each outermost call of a watched module (its
    forward scopes: a generation's steps are calls of one forward phase)."""
    ev = cap.events
    forward = (ev.addr & MODULE_BACKWARD) == 0
    idx = np.flatnonzero(((ev.kind == EventKind.MODULE_ENTER) | (ev.kind == EventKind.MODULE_EXIT)) & forward)
    if not len(idx):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    step = np.where(ev.kind[idx] == EventKind.MODULE_ENTER, 1, -1)
    depth = np.cumsum(step)
    # (an exit whose entry came before recording began: depth held at 0)
    depth -= np.minimum(np.minimum.accumulate(depth), 0)
    before = np.concatenate(([0], depth[:-1]))
    first = idx[(before == 0) & (step == 1)]
    last = idx[(before == 1) & (depth == 0)]
    if len(last) < len(first):  # a call open when recording stopped
        last = np.append(last, len(ev))
    return first.astype(np.int64), last[:len(first)].astype(np.int64)
