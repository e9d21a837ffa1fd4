"""Workspaces: memory a library asks the caching allocator for, owned by no
tensor (docs/attribution.md, `workspace`).

- cuBLAS and cuBLASLt keep one per handle and stream; each CUDA baseline
  lists the ones torch holds.
- cuDNN's are asked for by a cuDNN op for itself, inside one call, and given
  back before it returns (a convolution plan's, batch norm's, an RNN's,
  cuDNN attention's).
"""

from __future__ import annotations

import numpy as np

from ..capture.format import EventKind
from ..capture.reader import Capture
from .ops import op_names

__all__ = ["LIBRARY_WORKSPACE_OPS", "cublas_workspaces", "library_allocation", "library_workspaces"]


def cublas_workspaces(cap: Capture, addr: np.ndarray, start: np.ndarray, end: np.ndarray, n: int) -> np.ndarray:
    """Rows that are cuBLAS/cuBLASLt workspaces: the baselines list the
    workspaces torch held (docs/format.md); a row live at the end baseline at
    one of its addresses, or one from before recording at a start baseline's."""
    out = np.zeros(len(addr), bool)
    for label, live in (("end", end >= n), ("start", start < 0)):
        base = cap.baseline(label)
        spaces = [int(w["address"]) for w in (base or {}).get("workspaces") or () if "address" in w]
        if spaces:
            out |= live & np.isin(addr, np.array(spaces, np.uint64).astype(addr.dtype))
    return out


# The ops inside which torch asks the caching allocator directly (not for a
# tensor) for a library's workspace: cuDNN's convolutions (the v8 API's plan
# workspace), batch norm, RNNs and attention (aten/src/ATen/native/cudnn/).
LIBRARY_WORKSPACE_OPS = frozenset({
    "aten::cudnn_convolution", "aten::cudnn_convolution_transpose", "aten::convolution_backward",
    "aten::cudnn_batch_norm", "aten::cudnn_batch_norm_backward", "aten::_cudnn_rnn", "aten::_cudnn_rnn_backward",
    "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_cudnn_attention_backward",
    "aten::_cudnn_attention_forward", "aten::_cudnn_attention_backward"})
# Factories through which such an op allocates for itself (at::empty), as
# opposed to the copies it makes of its inputs (contiguous, clone, to).
_FACTORY_OPS = frozenset({"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty"})


def library_allocation(chain: tuple[str, ...]) -> bool:
    """Whether an allocation with this op chain (outermost first) was made by
    a LIBRARY_WORKSPACE_OPS op for itself: that op innermost, or followed
    only by tensor factories."""
    for i in range(len(chain) - 1, -1, -1):
        if chain[i] in LIBRARY_WORKSPACE_OPS:
            return True
        if chain[i] not in _FACTORY_OPS:
            return False
    return False


def library_workspaces(cap: Capture, start: np.ndarray, end: np.ndarray, n: int) -> np.ndarray:
    """Rows that are a library's workspace: allocated by an op of
    LIBRARY_WORKSPACE_OPS for itself (library_allocation) and freed before
    that op call returned,
    that is before the allocating thread's next allocation under another op
    (frees are recorded without their op: c10 frees under its own lock)."""
    ev = cap.events
    out = np.zeros(len(start), bool)
    recorded = np.flatnonzero((start >= 0) & (end < n))
    if not len(recorded):
        return out
    alloc_op = ev.op[start[recorded]]
    present = np.flatnonzero(np.bincount(alloc_op))  # op ids are stack-tree nodes: few, small
    names = op_names(cap, present[present != 0])
    library = [op for op, name in names.items() if library_allocation(name.chain)]
    if not library:  # no cuDNN op allocated (a CPU capture, a model without one): nothing to find
        return out
    candidates = recorded[np.isin(alloc_op, np.array(library, alloc_op.dtype))]
    # Per thread, each ALLOC's next ALLOC under a different op (n: none).
    allocs = np.flatnonzero(ev.kind == EventKind.ALLOC)
    change_after = np.full(n + 1, n, np.int64)
    for thread in np.unique(ev.thread[allocs]).tolist():
        idx = allocs[ev.thread[allocs] == thread]
        ops = ev.op[idx]
        run_start = np.flatnonzero(np.r_[True, ops[1:] != ops[:-1]])
        next_run = np.r_[idx[run_start[1:]], n]
        change_after[idx] = np.repeat(next_run, np.diff(np.r_[run_start, len(idx)]))
    s = start[candidates]
    out[candidates] = end[candidates] < change_after[s]
    return out
