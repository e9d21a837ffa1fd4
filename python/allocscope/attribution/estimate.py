"""The textbook estimate (docs/attribution.md) for a watched model, and the
waterfall of measured line items that takes it to what was measured.

Theory, for the moment analysed:
  parameters           bytes of the watched models' parameters (the weights)
  gradients            the trainable parameters again, when the capture trains
                       (has a backward phase)
  optimizer_state      k x trainable bytes: SGD 0, SGD with momentum 1,
                       Adam/AdamW 2 (3 with amsgrad), ...; 0 where the run
                       ran out of memory before its first optimizer step
                       (the state never existed)
  activations          the sum of leaf modules' new outputs in the forward
                       pass that the moment belongs to (the last one begun);
                       in inference (no backward phase) nothing is kept for
                       a backward pass, and one forward needs about its
                       largest layer output at a time: the largest leaf
                       module's new output in the calls of the model begun
                       by then (a generation's prefill, a serving engine's
                       profile run over its largest batch)
  activation_gradients as much again, when training ("backward doubles")
  inputs               the inputs of that forward pass
  kv_cache             inference: the KV cache for the tokens asked, 2 x
                       layers x key/value heads x head dim x bytes per
                       element x sequences x (prompt + new tokens), where
                       the model's config gives the first and its last
                       generate() call the second (recording/generation.py)

Waterfall: one item per category (measured requested bytes minus the theory
figure it corresponds to; categories the estimate ignores count in full),
then allocator rounding (requests rounded as the allocator rounds them, minus
the requests), unsplit remainders (the blocks' real sizes, from an exact
replay, minus the rounded requests), free memory in private pools (CUDA
graphs': their segments minus their live blocks), the rest of the cached
free memory (reserved minus the blocks) and memory outside PyTorch's allocator (device used minus
reserved). The items sum exactly from theory["total"] to the measured total;
waterfall() checks that and raises ConservationError if not.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..capture.baselines import closing_baseline, nccl_memory, outside_allocator
from ..capture.format import MODULE_LEAF, EventKind
from .categories import Attribution
from .kv_cache import model_calls
from .pools import private_pool_reserved, private_pool_rows
from .timeline import Moment, Timeline

__all__ = ["ConservationError", "theory", "waterfall"]

# (category, the theory figure it is compared with, what the difference usually is)
_LINES = (
    ("parameter", "parameters", "parameters", "storage shared by tied weights counted once"),
    ("buffer", "buffers", None, "buffers (BatchNorm running statistics, ...) are not parameters in the estimate"),
    ("gradient", "gradients", "gradients", "gradients live only from backward until zero_grad"),
    ("optimizer_state", "optimizer_state", "optimizer_state",
     "optimizer state exists only after the first step; step counters and other extras"),
    ("activation", "activations", "activations",
     "autograd saves inputs, masks and indices, not only layer outputs; checkpointing saves less"),
    ("input", "inputs", "inputs", "the batch and its copies"),
    ("output", "outputs", None, "forward results the training loop keeps past backward: outputs, the loss"),
    ("kv_cache", "kv_cache", "kv_cache",
     "keys and values cached between decoding steps (transformers' caches, vLLM's and SGLang's KV blocks), "
     "beyond the tokens asked: a static cache's unused positions, the last new token (never fed back), "
     "a serving engine's cache sized to the memory left"),
    ("engine", "engine_buffers", None,
     "a serving engine's own buffers outside its model: input ids and positions, block tables, sampling and "
     "logits state (vLLM's, SGLang's)"),
    ("temporary", "temporaries", "activation_gradients",
     "intermediates freed within their phase, in place of the estimate's activation gradients"),
    ("workspace", "workspaces", None,
     "cuBLAS/cuBLASLt workspaces (one per handle and stream) and cuDNN's, not in the estimate"),
    ("other", "other", None, "allocated outside watched phases, or before recording"),
    ("unknown", "unknown", None, "allocations no rule explains"),
)


# The lines whose reason differs in inference (no backward phase).
_INFERENCE_DETAIL = {
    "activations": "inference keeps nothing for a backward pass: a forward's layer outputs are temporaries",
    "temporaries": "intermediates freed within their phase: in inference, every layer's outputs and scratch",
}


class ConservationError(AssertionError):
    """The waterfall does not add up: a bug in the analysis."""


def _forward_at(att: Attribution, e: int) -> tuple[int, int, int] | None:
    """(first event, end event, leaf output bytes) of the forward phase
    moment e belongs to: the last forward begun at or before e, else the
    first one."""
    forwards = att.leaf_outputs()
    if not forwards:
        return None
    begun = [f for f in forwards if f[0] <= e]
    return begun[-1] if begun else forwards[0]


def _largest_call(att: Attribution, e: int) -> tuple[int, int, int] | None:
    """(first event, end event, bytes) of the outermost call of a watched
    model, begun at or before e (else the first), with the largest new
    output of a leaf module, and that output's bytes: inference's "one
    forward" (module docstring)."""
    first, last = model_calls(att.capture)
    if not len(first):
        return None
    ev = att.capture.events
    idx = np.flatnonzero((ev.kind == EventKind.MODULE_EXIT) & (ev.addr == MODULE_LEAF))
    sizes = ev.size[idx].astype(np.int64)
    lo, hi = np.searchsorted(idx, first), np.searchsorted(idx, last)
    largest = np.array([sizes[a:b].max() if b > a else 0 for a, b in zip(lo.tolist(), hi.tolist(), strict=True)],
                       np.int64)
    begun = np.flatnonzero(first <= e)
    pick = int(begun[np.argmax(largest[begun])]) if len(begun) else 0
    return int(first[pick]), int(last[pick]), int(largest[pick])


def _kv_cache_asked(watches: list[dict[str, Any]]) -> tuple[int, int]:
    """(bytes, tokens) of the KV cache for the tokens the watched models'
    last generate() calls asked (module docstring); (0, 0) where none says."""
    total = tokens = 0
    for w in watches:
        shape, asked = w.get("kv_cache"), w.get("generate")
        if isinstance(shape, dict) and isinstance(asked, dict):
            n = int(asked["sequences"]) * (int(asked["prompt_tokens"]) + int(asked["max_new_tokens"]))
            tokens += n
            total += n * int(shape["bytes_per_token"])
    return total, tokens


def _died_before_optimizer(att: Attribution) -> int | None:
    """The capture's first OOM where no optimizer step ever began (a run
    that died in its first forward or backward), else None. (A run that
    caught it and stepped later, at a smaller batch say, did not die.)"""
    ooms = np.flatnonzero(att.capture.events.kind == EventKind.OOM)
    if not len(ooms):
        return None
    began = any(name == "optimizer" for name in att.phase_names)
    return None if began else int(ooms[0])


def theory(att: Attribution, e: int) -> dict[str, Any]:
    """The estimate for the moment after event e (bytes; see module docstring)."""
    training = "backward" in att.phase_names
    notes: list[str] = []
    # The models alive at that moment: one the program dropped (rebuilt
    # after an out-of-memory error, say) is no longer in it.
    watches = att.watches_at(e)
    parameters = sum(int(w.get("parameters", 0)) for w in watches)
    trainable = sum(int(w.get("trainable", 0)) for w in watches)
    optimizer_state = 0
    optimizers = []
    for w in watches:
        opt = w.get("optimizer")
        if not opt:
            continue
        optimizers.append(opt.get("type"))
        k = opt.get("state_per_parameter")
        if k is None:
            notes.append(f"{opt.get('type')}: no textbook rule for its state; counted as 0")
        else:
            optimizer_state += int(round(k * int(w.get("trainable", 0))))
    activations = inputs = 0
    span = _forward_at(att, e) if training else _largest_call(att, e)
    if span is not None:
        first, end, activations = span
        if not activations:
            notes.append("no layer outputs were seen in this forward (a torch.compile'd model's layers run inside "
                         "its graph, where the watch's hooks do nothing): the estimate's activations are 0")
        ev = att.capture.events
        idx = np.flatnonzero(ev.kind == EventKind.INPUT)
        idx = idx[(idx >= first) & (idx < end)]
        seen: dict[int, int] = {}
        for a, s in zip(ev.addr[idx].tolist(), ev.size[idx].tolist(), strict=True):
            seen[a] = s
        inputs = sum(seen.values())
    if not att.watches:
        notes.append("no model was watched (allocscope.watch): the estimate is empty")
    elif not watches:
        notes.append("no watched model was alive at this moment: the estimate is empty")
    died = _died_before_optimizer(att)
    if training and died is not None:
        # The steady state the textbook describes was never reached: the
        # estimate is of what existed when the run died.
        notes.append(f"the run ran out of memory at event {died}, before its first optimizer step: the estimate "
                     "is of what existed then, without optimizer state"
                     + (f" ({optimizer_state} bytes by the textbook's rule, never made)" if optimizer_state else ""))
        optimizer_state = 0
    kv_cache, kv_tokens = _kv_cache_asked(watches) if not training else (0, 0)
    out = {
        "parameters": parameters,
        "gradients": trainable if training else 0,
        "optimizer_state": optimizer_state if training else 0,
        "activations": activations,
        "activation_gradients": activations if training else 0,
        "inputs": inputs,
        "kv_cache": kv_cache,
        "kv_cache_tokens": kv_tokens,
        "training": training,
        "optimizers": optimizers,
        "notes": notes,
    }
    out["total"] = sum(out[k] for k in ("parameters", "gradients", "optimizer_state", "activations",
                                        "activation_gradients", "inputs", "kv_cache"))
    return out


def waterfall(att: Attribution, m: Moment, th: dict[str, Any], tl: Timeline) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(items, measured): items take th["total"] to measured["total_bytes"]."""
    items = []
    for category, item, figure, detail in _LINES:
        t = int(th[figure]) if figure else 0
        if not th["training"]:
            detail = _INFERENCE_DETAIL.get(item, detail)
        items.append({"item": item, "bytes": m.by_category[category] - t, "measured_bytes": m.by_category[category],
                      "theory_bytes": t, "detail": detail})
    items.append({"item": "allocator_rounding", "bytes": m.rounded_bytes - m.requested_bytes,
                  "detail": "requests rounded up to the allocator's block sizes (CUDA: multiples of 512 B, "
                            "or roundup_power2_divisions)"})
    unsplit = {"item": "unsplit_remainder", "bytes": m.allocated_bytes - m.rounded_bytes,
               "detail": "blocks handed out whole: the rest of a cached block too small to split off "
                         "(under 512 B; 1 MiB or less in the large pool), or any request of max_split_size_mb or more"}
    if not att.blocks_exact:
        unsplit["detail"] += "; only where the replay knew the block (the rest count as cached free)"
    items.append(unsplit)
    pos = m.event + 1
    measured: dict[str, Any] = {"allocated_bytes": int(tl.allocated[pos]), "requested_bytes": int(tl.requested[pos])}
    basis = "allocated"
    total = int(tl.allocated[pos])
    if tl.reserved is not None:
        reserved = int(tl.reserved[pos])
        in_pools = att.live(m.event) & private_pool_rows(att)
        pools = max(0, private_pool_reserved(att.capture, m.event + 1) - int(att.block[in_pools].sum()))
        if pools:
            items.append({"item": "graph_pools", "bytes": pools,
                          "detail": "free in CUDA graphs' private pools (and MemPools'): kept for the graphs' "
                                    "replays, which only their own allocations can use"})
        items.append({"item": "cached_free", "bytes": reserved - m.allocated_bytes - pools,
                      "detail": "reserved by the caching allocator but not allocated (cached blocks, "
                                "fragmentation" + (")" if att.blocks_exact else
                                                   ", remainders of blocks the replay did not know)")})
        measured["reserved_bytes"] = reserved
        basis, total = "reserved", reserved
        base = closing_baseline(att.capture)
        outside = outside_allocator(base) if base else None
        if outside is not None:
            when = ("the end of recording" if base.get("label") == "end" else "the start of recording"
                    if base is att.capture.recording_start() else
                    f"the last baseline, {base.get('label')!r}: the process did not stop cleanly")
            detail = ("device memory used outside PyTorch's allocator: the CUDA context, libraries, other "
                      f"processes (read at {when})")
            start = att.capture.recording_start()  # (a read from a checkpoint: not the checkpoint's)
            at_start = outside_allocator(start) if start is not None and start is not base else None
            if at_start is not None and at_start < outside:
                # On a GPU this grows as CUDA loads kernels and libraries
                # create handles on first use; when in between is not recorded.
                detail += (f"; {at_start} bytes at the start: kernels and library handles (cuBLAS, cuDNN) "
                           "load on first use, so earlier moments may have used up to "
                           f"{outside - at_start} bytes less")
            elif at_start is not None and at_start > outside:
                detail += (f"; {at_start} bytes at the start: memory held outside the allocator then (another "
                           "process, a library) was released since, so earlier moments may have used more")
            if at_start is not None and at_start != outside:
                measured["outside_allocator_at_start_bytes"] = at_start
            nccl = nccl_memory(base)
            if nccl is not None and nccl[1] > 0:
                # NCCL's buffers live as long as their communicators: a run
                # that destroys its process group before recording ends
                # held them at its peak all the same.
                now, peak = nccl
                items.append({"item": "nccl", "bytes": peak,
                              "detail": "NCCL's own device memory: connection buffers per channel and peer, NVLS "
                                        "(the virtual NCCL's model, docs/vgpu.md)" +
                                        ("" if now == peak else "; its most, held until the process group was "
                                                                "destroyed")})
                outside -= now
                detail = detail.replace("the CUDA context, libraries", "the CUDA context, other libraries")
            items.append({"item": "outside_allocator", "bytes": outside, "detail": detail})
            device_used = reserved + outside + (nccl[1] if nccl is not None else 0)
            measured["device_used_bytes"] = device_used
            basis, total = "device_used", device_used
    measured["basis"] = basis
    measured["total_bytes"] = total
    got = int(th["total"]) + sum(int(i["bytes"]) for i in items)
    if got != total:
        raise ConservationError(f"the waterfall sums to {got} bytes, not the measured {total} "
                                f"(moment after event {m.event})")
    return items, measured
