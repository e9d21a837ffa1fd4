"""Giving every allocation a meaning: category, module, phase, iteration.

The rules are written down in docs/attribution.md; in short:

1. Rows. Every allocation recorded while recording is a row, from its ALLOC
   event to its FREE (or the end). Memory that already existed when recording
   started is a row too, live from the start: on CUDA every allocated block of
   the start baseline; anywhere, a tensor label naming an address no recorded
   allocation covers (a model built before recording, on the CPU).
2. Labels (PARAMETER ... INPUT annotations) attach to the row live at their
   address when they were written. A row labelled more than once keeps the
   highest-priority label (format.TENSOR_LABELS order: a parameter saved for
   backward stays a parameter).
3. Unlabelled rows get a category from their phase (PHASE annotations): made
   outside any watched phase or before recording -> other; freed before their
   phase ended -> temporary; made in forward and freed in backward (kept
   alive by the autograd graph) -> activation; other survivors of forward
   (outputs, the loss) -> output, of backward -> gradient, of the optimizer
   -> optimizer_state. A cuBLAS/cuBLASLt workspace (the baselines list
   torch's), or a cuDNN workspace (allocated by a cuDNN op for itself and
   freed before the call returned: workspaces.py) -> workspace. A library's
   KV cache, kept past the model call that made it -> kv_cache; a serving
   engine's own buffers -> engine (kv_cache.py). unknown: phases unknown.
4. Module: a labelled row's from its label (the parameter's module, the module
   that saved the activation); others the innermost module scope open on the
   allocating thread (forward scopes nest; backward scopes close when their
   inputs' gradients are ready, or when the phase ends).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from ..allocator.segments import baseline_blocks
from ..allocator.sizes import round_sizes
from ..capture.format import MODULE_LEAF, TENSOR_LABELS, EventKind
from ..capture.reader import Capture
from ..common.native import analysis_for
from .lifetimes import allocated_first
from .resumed import put_back
from ..common.arrays import factorize, first_index
from .kv_cache import engine_rows, kv_cache_rows
from .workspaces import cublas_workspaces, library_workspaces
from .rows import Rows, join_labels
from .scopes import Names, module_scopes
from .watches import Watches, read_watches

__all__ = ["CATEGORIES", "PHASES", "Attribution", "attribute", "module_label"]

CATEGORIES = ("parameter", "buffer", "gradient", "optimizer_state", "activation", "input", "output",
              "kv_cache", "engine", "temporary", "workspace", "other", "unknown")
PHASES = ("none", "forward", "backward", "optimizer", "other")

_CAT = {name: i for i, name in enumerate(CATEGORIES)}
_LABEL_CATEGORY = {EventKind.PARAMETER: "parameter", EventKind.BUFFER: "buffer", EventKind.GRADIENT: "gradient",
                   EventKind.OPTIMIZER_STATE: "optimizer_state", EventKind.INPUT: "input",
                   EventKind.ACTIVATION: "activation"}
_PRIORITY = {int(k): i for i, k in enumerate(TENSOR_LABELS)}
_PRIORITY_OF = np.full(256, len(TENSOR_LABELS), np.int64)
_PRIORITY_OF[list(_PRIORITY)] = list(_PRIORITY.values())


@dataclasses.dataclass
class Attribution:
    """Rows (allocations) with their meaning, and the capture's watch
    annotations.

    Row i is live after event e when start[i] <= e < end[i]; start is -1 for
    memory that existed before recording, end is len(events) for memory still
    live at the end. size: requested bytes; rounded: the request rounded
    as the allocator rounds it (CUDA: round_size); block: the size of the
    block that held it (CUDA: rounded plus any remainder the allocator did
    not split off, from the baseline or an exact replay; `blocks_exact`
    says whether every CUDA block's size is known, else rounded stands in).
    """

    capture: Capture
    n_events: int
    addr: np.ndarray
    size: np.ndarray
    rounded: np.ndarray
    block: np.ndarray
    start: np.ndarray
    end: np.ndarray
    stack: np.ndarray
    op: np.ndarray  # stack node of the op chain that allocated it (0: none, or not recorded)
    thread: np.ndarray
    device: np.ndarray
    category: np.ndarray  # index into CATEGORIES
    module: np.ndarray  # index into names, -1 for none
    label: np.ndarray  # index into names: the tensor's name, -1 for none
    phase: np.ndarray  # index into PHASES
    iteration: np.ndarray  # optimizer steps completed when it was allocated
    names: list[str]
    phase_starts: np.ndarray  # event index of each PHASE annotation
    phase_names: list[str]
    phase_iterations: np.ndarray
    watches: list[dict[str, Any]]  # every watch, its updates merged (watches_at: those alive at a moment)
    device_type: str
    warnings: list[str]
    blocks_exact: bool = True
    watch_histories: Watches = dataclasses.field(default_factory=Watches)

    @property
    def rows(self) -> int:
        return len(self.addr)

    def live(self, event_index: int) -> np.ndarray:
        """Boolean mask of rows live after event `event_index` (-1: at the start)."""
        return (self.start <= event_index) & (self.end > event_index)

    def watches_at(self, event_index: int) -> list[dict[str, Any]]:
        """The watches whose model was alive after event `event_index`, as
        their updates had made them by then."""
        return self.watch_histories.at(event_index)

    def name(self, index: int) -> str:
        return self.names[index] if index >= 0 else ""

    @functools.cached_property
    def module_classes(self) -> dict[str, str]:
        """{module name: its class name} from the watches (captures made
        before watches recorded classes have none)."""
        out: dict[str, str] = {}
        for w in self.watches:
            classes = w.get("classes")
            if isinstance(classes, dict):
                out.update({str(k): str(v) for k, v in classes.items()})
        return out

    def leaf_outputs(self) -> list[tuple[int, int, int]]:
        """(first event, last event, bytes) of each forward phase: the bytes
        of new outputs of leaf modules (the textbook's "layer outputs")."""
        ev = self.capture.events
        idx = np.flatnonzero((ev.kind == EventKind.MODULE_EXIT) & (ev.addr == MODULE_LEAF))
        # Bytes of leaf outputs up to each event, then differences per phase.
        before = np.concatenate([[0], np.cumsum(ev.size[idx].astype(np.int64))])
        starts = np.asarray(self.phase_starts, np.int64)
        if not len(starts):
            return []
        ends = np.append(starts[1:], self.n_events)
        lo = np.searchsorted(idx, starts, side="right")  # first leaf exit after the phase starts
        hi = np.searchsorted(idx, ends, side="left")
        return [(int(s), int(e), int(before[h] - before[lo_])) for s, e, lo_, h, name
                in zip(starts.tolist(), ends.tolist(), lo.tolist(), hi.tolist(), self.phase_names, strict=True)
                if name == "forward"]

    def rows_of(self, events: list[int]) -> dict[int, int]:
        """{event index: row} for ALLOC events that made a row (others left out)."""
        recorded = int(np.count_nonzero(self.start >= 0))  # recorded rows come first, by start
        starts = self.start[:recorded]
        want = np.asarray(events, np.int64)
        pos = np.minimum(np.searchsorted(starts, want), max(recorded - 1, 0))
        hit = (recorded > 0) & (starts[pos] == want) if recorded else np.zeros(len(want), bool)
        return {int(e): int(r) for e, r, h in zip(want.tolist(), pos.tolist(), np.atleast_1d(hit).tolist(),
                                                  strict=True) if h}


def _label_module(kind: int, name: str) -> str:
    """The module a tensor label belongs to: `GPT.h.0.attn.weight` -> `GPT.h.0.attn`."""
    if kind == EventKind.ACTIVATION:
        return name
    if kind == EventKind.OPTIMIZER_STATE:
        name = name.rsplit("/", 1)[0]
    if kind == EventKind.INPUT:
        return name.split(".input", 1)[0]
    return name.rsplit(".", 1)[0] if "." in name else name


def _label_meaning(cap: Capture, label_idx: np.ndarray, label_rows: np.ndarray, n_rows: int,
                   names: Names) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(category, label, module) per row from its highest-priority label
    (the first of equal priority; -1: unlabelled)."""
    ev, strings = cap.events, cap.strings
    category = np.full(n_rows, -1, np.int64)
    label = np.full(n_rows, -1, np.int64)
    module = np.full(n_rows, -1, np.int64)
    js = np.flatnonzero(label_rows >= 0)
    if not len(js):
        return category, label, module
    kinds = ev.kind[label_idx[js]].astype(np.int64)
    sids = ev.arg[label_idx[js]].astype(np.int64)
    r = label_rows[js]
    # The labels that beat every earlier label of their row, in event order:
    # their names are registered in that order (names' ids are stable).
    winners, last = _label_winners(r, _PRIORITY_OF[kinds])
    width = int(sids.max()) + 1
    keys, key_of = factorize(kinds[winners] * width + sids[winners])  # each winner's (kind, string id)
    meaning = np.zeros((len(keys), 3), np.int64)  # per key: category, label, module
    for u in np.argsort(first_index(key_of, len(keys)), kind="stable").tolist():  # in order of first sight
        k, sid = divmod(int(keys[u]), width)
        text = strings[sid] if sid < len(strings) else "?"
        meaning[u] = (_CAT[_LABEL_CATEGORY[EventKind(k)]], names(text) if k != EventKind.ACTIVATION else -1,
                      names(_label_module(k, text)))
    # Each row's final winner: its last label that beat the earlier ones.
    best = r[winners[last]]
    category[best], label[best], module[best] = meaning[key_of[last]].T
    return category, label, module


def _label_winners(row: np.ndarray, priority: np.ndarray, engine: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """Of labels in event order (their rows, their priorities: lower wins),
    those that beat every earlier label of their row (the first of equal
    priority stays), in event order, and whether each is its row's last.
    engine: "native" (one pass, allocscope._analysis.label_winners), "numpy"
    (the reference, by a sort) or "auto"."""
    fast = analysis_for(engine, "numpy")
    if fast is not None:
        winners, last = fast.label_winners(np.ascontiguousarray(row, np.int64),
                                           np.ascontiguousarray(priority, np.int64))
        return winners, last.astype(bool)
    if not len(row):
        return np.zeros(0, np.int64), np.zeros(0, bool)
    by_row = np.argsort(row, kind="stable")
    group = np.concatenate(([0], np.cumsum(row[by_row][1:] != row[by_row][:-1])))
    shifted = priority[by_row] - group * (int(priority.max(initial=0)) + 1)  # rows apart, in row order
    before = np.concatenate(([np.iinfo(np.int64).max], np.minimum.accumulate(shifted)[:-1]))
    first = np.concatenate(([True], group[1:] != group[:-1]))
    winners = np.sort(by_row[first | (shifted < before)])
    order = np.argsort(row[winners], kind="stable")
    last = np.zeros(len(winners), bool)
    last[order[np.concatenate((row[winners][order][1:] != row[winners][order][:-1], [True]))]] = True
    return winners, last


def _phase_rule(p_idx: np.ndarray, phase_code: np.ndarray, p_iter: np.ndarray, start: np.ndarray, end: np.ndarray,
                n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(phase, iteration, category by the phase rule) per row (rule 3 of the module docstring)."""
    p_end = np.append(p_idx[1:], n)
    inst = np.searchsorted(p_idx, start, side="right") - 1  # phase instance of each allocation
    has_phase = inst >= 0
    phase = np.where(has_phase, phase_code[np.maximum(inst, 0)] if len(p_idx) else 0, 0)
    iteration = np.where(has_phase, p_iter[np.maximum(inst, 0)] if len(p_idx) else 0, 0)
    freed_in_phase = has_phase & (end < np.where(has_phase, p_end[np.maximum(inst, 0)] if len(p_idx) else n, n))
    free_inst = np.searchsorted(p_idx, end, side="right") - 1
    freed_in_backward = (end < n) & (free_inst >= 0) & (
        (phase_code[np.maximum(free_inst, 0)] if len(p_idx) else 0) == PHASES.index("backward"))
    rule = np.full(len(start), _CAT["unknown"], np.int64)
    # Survivors of their phase: forward results the loop keeps past backward
    # (outputs, the loss), gradients backward made outside any parameter's
    # .grad (inputs' gradients), optimizer-made state without a label.
    rule[phase == PHASES.index("forward")] = _CAT["output"]
    rule[phase == PHASES.index("backward")] = _CAT["gradient"]
    rule[phase == PHASES.index("optimizer")] = _CAT["optimizer_state"]
    rule[(phase == PHASES.index("forward")) & freed_in_backward & ~freed_in_phase] = _CAT["activation"]
    rule[freed_in_phase] = _CAT["temporary"]
    rule[(phase == 0) | (phase == PHASES.index("other")) | (start < 0)] = _CAT["other"]
    return phase, iteration, rule


def attribute(cap: Capture, block_sizes: np.ndarray | None = None) -> Attribution:
    """Attributes every allocation of a capture (see the module docstring).
    block_sizes: per event, the block size of each ALLOC (0: unknown), from a
    replay with the recorded settings (Replay.block_sizes); without it CUDA
    blocks are taken to be their rounded size."""
    ev = cap.events
    n = len(ev)
    warnings: list[str] = []
    device_type = "cuda" if "cuda" in cap.metadata.get("devices_recorded", []) else "cpu"
    strings = cap.strings

    def string(i: int) -> str:
        sid = int(ev.arg[i])
        return strings[sid] if sid < len(strings) else "?"

    # ---- rows: recorded allocations, then memory from before recording
    rows = Rows(cap, n, block_sizes)
    base = cap.baseline("start") if device_type == "cuda" else None
    if base is not None and base.get("segments") is not None:
        pre = sorted(baseline_blocks(base).items())
        if cap.prefix_events:  # read from a checkpoint: its rows, then memory from before recording
            held = put_back(cap, *(rows.parts[c][0] for c in ("addr", "start", "end", "block")), dict(pre))
            pre = [(a, b) for a, b in pre if a not in held]
        # A block whose first event is its ALLOC is that allocation (one row).
        same = allocated_first(rows.parts["addr"][0], rows.parts["start"][0], rows.unmatched_frees_at,
                               [a for a, _ in pre])
        pre = [(a, b) for a, b in pre if a not in same]
        rows.add_older([a for a, _ in pre], [r for _, (_, r, _) in pre], [b for _, (b, _, _) in pre],
                       [rows.free_after(a, -1) for a, _ in pre], [d for _, (_, _, d) in pre])
    label_idx = np.flatnonzero(np.isin(ev.kind, [int(k) for k in TENSOR_LABELS]))
    label_rows = join_labels(ev, rows, label_idx, device_type, warnings)
    A, S, B, ST, EN = (rows.column(c) for c in ("addr", "size", "block", "start", "end"))

    # ---- labels: category and name by priority, then the phase rule for the rest
    names = Names()
    category, label, module = _label_meaning(cap, label_idx, label_rows, len(A), names)
    p_idx = np.flatnonzero(ev.kind == EventKind.PHASE)
    phase_names = [string(i) for i in p_idx.tolist()]
    phase_code = np.array([PHASES.index(p) if p in PHASES else 0 for p in phase_names], np.int64)
    p_iter = ev.addr[p_idx].astype(np.int64)
    phase, iteration, rule = _phase_rule(p_idx, phase_code, p_iter, ST, EN, n)
    unlabelled = category < 0
    category[unlabelled] = rule[unlabelled]
    category[engine_rows(cap, rows.column("stack"), ST) & unlabelled] = _CAT["engine"]
    category[cublas_workspaces(cap, A, ST, EN, n) & unlabelled] = _CAT["workspace"]
    if device_type == "cuda":  # cuDNN's (on the CPU these ops' temporaries stay temporaries)
        category[library_workspaces(cap, ST, EN, n) & unlabelled] = _CAT["workspace"]
    category[kv_cache_rows(cap, rows.column("stack"), ST, EN) & unlabelled] = _CAT["kv_cache"]

    # ---- modules of unlabelled rows: the scope open on the allocating thread
    TH = rows.column("thread")
    module_scopes(cap, names, ST, TH, module, unlabelled)

    watches = read_watches(ev.kind, string, warnings)

    if device_type == "cuda":
        divisions = (base or {}).get("config", {}).get("roundup_power2_divisions", ())
        # A block is never smaller than its rounded request; only requests
        # of unknown size (0, in some baselines) would round above it.
        unknown = B <= 0
        rounded = round_sizes(S, divisions)
        R = np.where(unknown, rounded, np.minimum(rounded, B))
        blocks_exact = not bool(unknown.any())
        B[unknown] = R[unknown]
    else:
        R = B = np.where(B > 0, B, S)
        blocks_exact = True

    return Attribution(
        capture=cap, n_events=n, addr=A, size=S, rounded=R, block=B, start=ST, end=EN, stack=rows.column("stack"),
        op=rows.column("op"), thread=TH, device=rows.column("device"), category=category, module=module, label=label,
        phase=phase,
        iteration=iteration, names=names.names, phase_starts=p_idx, phase_names=phase_names,
        phase_iterations=p_iter, watches=watches.final(), device_type=device_type, warnings=warnings,
        blocks_exact=blocks_exact, watch_histories=watches)


def module_label(name: str, classes: dict[str, str], shown: str | None = None) -> str:
    """A module's name (or `shown`, a part of it: a tree's node) with its
    class where the name does not say it: "Sequential.5 (Conv2d)",
    "encoder.layers.0 (TransformerBlock)", but "GPT" for a model watched
    under its class name."""
    cls = classes.get(name)
    shown = name if shown is None else shown
    return f"{shown} ({cls})" if cls and name.rsplit(".", 1)[-1] != cls else shown
