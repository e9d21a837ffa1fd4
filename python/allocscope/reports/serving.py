"""A serving engine's memory: what the capture measured of it (the report's
"serving" section), what the engine itself reckoned and logged (a fit run's
log), and the two side by side (a fit card's "serving").

vLLM sizes its KV cache from a profile: the weights and the memory outside
torch (`consumed`), the peak of a dummy forward pass over the largest batch
(`profile_run`, its "peak activation"), and an estimate of its CUDA graphs'
memory; the rest of `gpu_memory_utilization` of the card becomes KV cache.
Every figure it logs is in GiB with two decimals; the capture has them to
the byte: the weights (the watched model's parameters and buffers), the
profile run's peak over what it left allocated (vLLM's definition: the
peak of allocated memory during the run minus what is allocated after
it), the CUDA graphs' private pools (reserved), the KV cache (its
category) and what the device used outside torch's allocator.

An engine that refuses to start for want of memory (vLLM: no room for the
KV cache of one request of max_model_len) has run out of memory as surely
as an allocation that failed: `engine_refusal` reads its reason, with the
shortfall, so that `fit` calls it "out of memory" and a search goes on."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..attribution.pools import private_pool_reserved
from ..capture.format import EventKind
from ..capture.stacks import stacks_through
from ..common.units import format_bytes
from .text import table

__all__ = ["ENGINE_LOG_LIMIT", "engine_figures", "engine_refusal", "read_log", "serving_lines", "serving_measured",
           "serving_side_by_side"]

GIB = 1 << 30
# How much of a run's log is read for the engine's lines (its start and its end).
ENGINE_LOG_LIMIT = 8 << 20


def _vllm_frame(filename: str, function: str) -> bool:
    return "/vllm/" in filename.replace("\\", "/")


def _vllm_function(name: str) -> Any:
    """A frame predicate: vLLM's function or method `name` (frames name
    methods by their qualified name, Class.method)."""
    return lambda filename, function: function.rpartition(".")[2] == name and _vllm_frame(filename, function)


def serving_measured(cap: Any, tl: Any, doc: dict[str, Any]) -> dict[str, Any] | None:
    """The report's "serving" section: a serving engine's memory as the
    capture measured it (module docstring); None where no engine ran."""
    if not len(cap.stack_parent) or not stacks_through(cap, _vllm_frame).any():
        return None
    out: dict[str, Any] = {"engine": "vllm"}
    by_category = (doc.get("peak") or {}).get("by_category") or {}
    out["weights_bytes"] = int(by_category.get("parameter", 0)) + int(by_category.get("buffer", 0))
    out["kv_cache_bytes"] = (doc.get("kv_cache") or {}).get("bytes")
    out["graph_pool_bytes"] = private_pool_reserved(cap, len(cap.events))
    out["outside_allocator_bytes"] = None
    gap = {g["item"]: g["bytes"] for g in doc.get("gap") or ()}
    if "outside_allocator" in gap:
        out["outside_allocator_bytes"] = int(gap["outside_allocator"]) + int(gap.get("nccl", 0))
    profile = _under(cap, "profile_run")
    out["profile_run"] = None
    if profile is not None:
        # vLLM reads the peak minus what the run left allocated
        first, last, after = profile
        peak = int(tl.allocated[first + 1:last + 2].max())
        out["profile_run"] = {"first_event": first, "last_event": last, "peak_allocated_bytes": peak,
                              "allocated_after_bytes": int(tl.allocated[after]),
                              "peak_activation_bytes": max(0, peak - int(tl.allocated[after]))}
    capture = _under(cap, "capture_model")
    out["capture_model"] = None
    if capture is not None and tl.reserved is not None:
        # what capturing the graphs added to reserved memory (vLLM's
        # "actual" graph memory: the device's free memory before and after)
        first, last, after = capture
        out["capture_model"] = {"first_event": first, "last_event": last,
                                "reserved_bytes": int(tl.reserved[after]) - int(tl.reserved[first])}
    return out


def _under(cap: Any, function: str) -> tuple[int, int, int] | None:
    """(first, last, after) memory events of the last call of a vLLM
    function: its first (or the segments mapped for it) and last ALLOC or
    FREE, and the index of the timeline's entry before the next ALLOC
    outside it (what the call left).
    Calls are told apart by allocations outside them in between (vLLM
    captures its graphs once to estimate their memory, allocates the KV
    cache, then captures them for good)."""
    inside = stacks_through(cap, _vllm_function(function))
    if not inside.any():
        return None
    ev = cap.events
    memory = (ev.kind == EventKind.ALLOC) | (ev.kind == EventKind.FREE)
    under = memory & inside[np.clip(ev.stack.astype(np.int64), 0, len(inside) - 1)]
    idx = np.flatnonzero(under)
    if not len(idx):
        return None
    outside = np.cumsum((ev.kind == EventKind.ALLOC) & ~under)[idx]
    idx = idx[outside == outside[-1]]
    first, last = int(idx[0]), int(idx[-1])
    # (the segments the first allocation mapped come just before it)
    while first > 0 and ev.kind[first - 1] in (EventKind.SEGMENT_ALLOC, EventKind.SEGMENT_MAP):
        first -= 1
    later = np.flatnonzero((ev.kind[last + 1:] == EventKind.ALLOC) & ~under[last + 1:])
    return first, last, last + 1 + int(later[0]) if len(later) else len(ev)


# ---- the engine's own figures, from its log


def _gib(text: str) -> int:
    return int(round(float(text) * GIB))


_VLLM_LINES = {
    "version": re.compile(r"Initializing a V1 LLM engine \(v([^)]+)\)"),
    "kv_cache_tokens": re.compile(r"GPU KV cache size: ([\d,]+) tokens"),
    "concurrency": re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"),
    "available": re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
    "graphs": re.compile(r"CUDA graph pool memory: ([\d.]+) GiB \(actual\), ([\d.]+) GiB \(estimated\)"),
    "usage": re.compile(r"Actual usage is ([\d.]+) GiB for consumed memory \(weights \+ non-torch\), ([\d.]+) GiB "
                        r"for peak activation, and ([\d.]+) GiB for CUDAGraph memory\. Replace gpu_memory_utilization "
                        r"config with `--kv-cache-memory=(-?\d+)`.*?`--kv-cache-memory=(-?\d+)`"),
    "weights": re.compile(r"Model loading took ([\d.]+) GiB memory"),
}
_VLLM_REFUSAL = re.compile(r"To serve at least one request with the model's max seq len \((\d+)\), \(([\d.]+) GiB KV "
                           r"cache is needed, which is larger than the available KV cache memory \(([\d.]+) GiB\)\."
                           r"(?: Based on the available memory, the estimated maximum model length is (\d+)\.)?")
_VLLM_NO_ROOM = "No available memory for the cache blocks."


def read_log(path: str | None) -> str:
    """A run's log for engine_figures: its first and last ENGINE_LOG_LIMIT / 2
    bytes (the engine sizes its cache early and fails late); "" where none."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            head = f.read(ENGINE_LOG_LIMIT // 2)
            f.seek(0, 2)
            size = f.tell()
            tail = b""
            if size > ENGINE_LOG_LIMIT // 2:
                f.seek(max(ENGINE_LOG_LIMIT // 2, size - ENGINE_LOG_LIMIT // 2))
                tail = f.read()
    except OSError:
        return ""
    return (head + b"\n" + tail).decode("utf-8", "replace")


def engine_figures(log: str) -> dict[str, Any] | None:
    """What vLLM logged of its memory (its first word on each: an engine
    that sized its cache twice, for a profile and for serving, logs the
    same); None where the log has none of it. Bytes from GiB figures are
    rounded as vLLM rounded them (to 0.01 GiB)."""
    found = {key: pattern.search(log) for key, pattern in _VLLM_LINES.items()}
    refusal = engine_refusal(log)
    if not any(found.values()) and refusal is None:
        return None
    out: dict[str, Any] = {"engine": "vllm", "version": found["version"].group(1) if found["version"] else None}
    if m := found["kv_cache_tokens"]:
        out["kv_cache_tokens"] = int(m.group(1).replace(",", ""))
    if m := found["concurrency"]:
        out["max_model_len"] = int(m.group(1).replace(",", ""))
        out["max_concurrency"] = float(m.group(2))
    if m := found["available"]:
        out["kv_cache_bytes"] = _gib(m.group(1))
    if m := found["weights"]:
        out["weights_bytes"] = _gib(m.group(1))
    if m := found["graphs"]:
        out["graph_bytes"], out["graph_estimate_bytes"] = _gib(m.group(1)), _gib(m.group(2))
    if m := found["usage"]:
        out["consumed_bytes"], out["peak_activation_bytes"] = _gib(m.group(1)), _gib(m.group(2))
        out.setdefault("graph_bytes", _gib(m.group(3)))
        out["kv_cache_memory_to_fit"], out["kv_cache_memory_to_fill"] = int(m.group(4)), int(m.group(5))
    if refusal is not None:
        out["refusal"] = refusal
    return out


def engine_refusal(log: str) -> dict[str, Any] | None:
    """Where vLLM refused to start for want of KV cache memory: the max_model_len
    asked, the KV cache one such request needs, what was left for it, the
    shortfall (the KV cache of the tokens past the longest length vLLM
    reckons would fit, where it says) and that length."""
    m = _VLLM_REFUSAL.search(log)
    if m:
        length, needed, available = int(m.group(1)), _gib(m.group(2)), _gib(m.group(3))
        estimated = int(m.group(4)) if m.group(4) else None
        # Both figures are rounded to 0.01 GiB, so that near the boundary
        # their difference is 0; the tokens past vLLM's longest length, at
        # what a token of the request takes, are not.
        short = needed - available if not estimated or estimated >= length else \
            (length - estimated) * needed // length
        return {"max_model_len": length, "needed_bytes": needed, "available_bytes": available,
                "shortfall_bytes": max(short, 1), "estimated_max_model_len": estimated}
    if _VLLM_NO_ROOM in log:
        return {"max_model_len": None, "needed_bytes": None, "available_bytes": 0, "shortfall_bytes": None,
                "estimated_max_model_len": None}
    return None


# ---- side by side: a fit card's "serving"


def serving_side_by_side(measured: dict[str, Any] | None, said: dict[str, Any] | None,
                         kv: dict[str, Any] | None) -> dict[str, Any] | None:
    """A fit card's "serving": the engine's figures (`said`), the capture's
    (`measured`), and from the measured KV cache the concurrency at the
    engine's max_model_len (tokens of cache over tokens a request may take)."""
    if measured is None and said is None:
        return None
    out: dict[str, Any] = {"engine": (measured or said or {}).get("engine"), "said": said, "measured": measured}
    length = (said or {}).get("max_model_len")
    if length and kv and kv.get("tokens") is not None:
        out["max_model_len"] = length
        out["max_concurrency"] = round(kv["tokens"] / length, 2)
        # The engine gives its KV cache all the memory left, so a setting
        # that would not fit shows first as this room running out (vLLM
        # refuses to start without the cache of one request of max_model_len).
        per_token = (kv.get("shape") or {}).get("bytes_per_token")
        if per_token:
            out["room_bytes"] = (kv["tokens"] - length) * per_token
    return out


def _maybe(n: int | None) -> str:
    return "" if n is None else format_bytes(n)


def _logged(n: int | None) -> str:
    """An engine's figure as it logged it: GiB to two decimals."""
    return "" if n is None else f"{n / GIB:.2f} GiB"


def serving_lines(serving: dict[str, Any] | None) -> list[str]:
    """A fit card's "serving" as text (indented by the caller)."""
    if not serving:
        return []
    said, got = serving.get("said") or {}, serving.get("measured") or {}
    name = f"vLLM {said.get('version') or ''}".rstrip()
    refusal = said.get("refusal")
    lines = []
    if refusal:
        if refusal["max_model_len"] is not None:
            est = refusal.get("estimated_max_model_len")
            lines.append(f"{name} refused to start: one request of max_model_len {refusal['max_model_len']:,} needs "
                         f"{format_bytes(refusal['needed_bytes'])} of KV cache, "
                         f"{format_bytes(refusal['available_bytes'])} was left for it" +
                         (f"; max_model_len={est} would fit (vLLM's estimate)" if est else ""))
        else:
            lines.append(f"{name} refused to start: no memory was left for the KV cache")
    profile = got.get("profile_run") or {}
    rows: list[tuple[str, ...]] = [("", f"{name} logged", "measured")]
    tokens = said.get("kv_cache_tokens")
    if tokens is not None or got.get("kv_cache_bytes") is not None:
        rows.append(("KV cache", (f"{tokens:,} tokens, " if tokens is not None else "") +
                     _logged(said.get("kv_cache_bytes")),
                     _maybe(got.get("kv_cache_bytes"))))
    if serving.get("max_concurrency") is not None or said.get("max_concurrency") is not None:
        length = serving.get("max_model_len") or said.get("max_model_len")
        rows.append((f"concurrency at {length:,} tokens",
                     f"{said['max_concurrency']:.2f}x" if said.get("max_concurrency") is not None else "",
                     f"{serving['max_concurrency']:.2f}x" if serving.get("max_concurrency") is not None else ""))
    if said.get("graph_bytes") is not None or got.get("graph_pool_bytes"):
        estimate = said.get("graph_estimate_bytes")
        rows.append(("CUDA graphs", _logged(said.get("graph_bytes")) +
                     (f" (estimated {_logged(estimate)})" if estimate is not None else ""),
                     f"{_maybe(got.get('graph_pool_bytes'))} in private pools"))
    captured = got.get("capture_model") or {}
    if captured:
        rows.append(("capturing the graphs", "", f"{format_bytes(captured['reserved_bytes'])} more reserved"))
    if said.get("peak_activation_bytes") is not None or profile:
        rows.append(("peak activation", _logged(said.get("peak_activation_bytes")) +
                     (" (with its graph estimate)" if said.get("graph_estimate_bytes") else ""),
                     f"{_maybe(profile.get('peak_activation_bytes'))} (profile run)" if profile else ""))
    if said.get("consumed_bytes") is not None or got.get("weights_bytes") is not None:
        outside = got.get("outside_allocator_bytes")
        rows.append(("weights, non-torch", _logged(said.get("consumed_bytes")),
                     f"{_maybe(got.get('weights_bytes'))} weights" +
                     (f", {format_bytes(outside)} outside torch's allocator (CUDA context included)"
                      if outside is not None else "")))
    if not said:  # (a report: the capture alone)
        rows = [(label, got_) for label, _, got_ in rows]
        rows[0] = (f"{name}, measured", "")
    if len(rows) > 1:
        lines += table(rows, set())
    if said.get("kv_cache_memory_to_fill") is not None:
        lines.append(f"{name} suggests --kv-cache-memory={said['kv_cache_memory_to_fill']} to fill the card, "
                     f"{said['kv_cache_memory_to_fit']} to stay within gpu_memory_utilization")
    return lines
