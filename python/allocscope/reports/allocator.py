"""The allocator's side of the report (docs/report.md, `allocator` and
`oom`, built and rendered as text): the replayed state at the peak of reserved memory with its
fragmentation, the post-mortem of an out-of-memory error, and the live
blocks that pin fragmented segments, named by the attribution."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..allocator.config import AllocatorConfig
from ..allocator.fragmentation import figures, fragmented_segments, stranded
from ..allocator.replay import OomRecord, Replay, replay
from ..allocator.segments import SegmentInfo
from ..allocator.sizes import allocation_size
from ..allocator.whatif import candidates
from ..attribution.categories import CATEGORIES, Attribution, module_label
from ..attribution.ops import op_names
from ..attribution.scopes import module_at
from ..attribution.timeline import bucket_peaks, moment
from ..capture.baselines import device_readings
from ..capture.format import EventKind
from ..capture.reader import Capture
from ..capture.events import Frame
from ..capture.stacks import folded_stack, package_of, site
from ..common.units import format_bytes
from .text import table
from .what_fits import would_fit

__all__ = ["allocator_lines", "allocator_section", "block_rows", "oom_lines", "oom_section", "oom_where",
           "pinning_blocks", "shortfall", "where_sentence", "would_fit_lines"]


def shortfall(o: OomRecord, config: AllocatorConfig) -> int | None:
    """Device memory a failing request was short of, after torch had
    released every cached block it could (None: no limit known)."""
    limit_bytes = o.allowed if o.allowed is not None else o.capacity
    if limit_bytes is None:
        return None
    if not o.recorded:  # a what-if failure: the replay went on as if served, and its state has the new segment
        return max(0, o.reserved - limit_bytes)
    return max(0, o.reserved + allocation_size(o.rounded, config.large_segment_size) - limit_bytes)


def _downsample(values: np.ndarray, points: int) -> list[int]:
    """values at most `points` long, each the maximum of its slice."""
    return [int(v) for v in values[bucket_peaks(values, points)]]


def block_rows(segments: list[SegmentInfo], att: Attribution | None) -> dict[int, int]:
    """{address: attribution row} of the busy blocks of replayed segments:
    by the event that allocated them (the block's event), or, for blocks
    from the start baseline (event -1), by address among the rows live from
    the start (read from a checkpoint: the rows live where it was taken)."""
    if att is None:
        return {}
    busy = [(b.address, b.event) for s in segments for b in s.blocks if b.active]
    by_event = att.rows_of([tag for _, tag in busy if tag >= 0])
    k = att.capture.prefix_events
    pre_rows = np.flatnonzero((att.start < k) & (att.end >= k))
    pre = dict(zip(att.addr[pre_rows].tolist(), pre_rows.tolist(), strict=True))
    out = {}
    for addr, tag in busy:
        row = by_event.get(tag) if tag >= 0 else pre.get(addr)
        if row is not None:
            out[addr] = row
    return out


def pinning_blocks(segments: list[SegmentInfo], att: Attribution | None, *, top: int = 5,
                   blocks_per_segment: int = 5) -> list[dict[str, Any]]:
    """The fragmented segments holding the most free bytes, each with the
    live blocks that keep it from being released (their category, module and
    the user's line that allocated them)."""
    rows = block_rows(segments, att)
    out = []
    for free, s, live in fragmented_segments(segments)[:top]:
        pins = []
        for b in live[:blocks_per_segment]:
            pin: dict[str, Any] = {"address": b.address, "size": b.size, "requested": b.requested, "state": b.state}
            row = rows.get(b.address)
            if att is not None and row is not None:
                pin["category"] = CATEGORIES[int(att.category[row])]
                pin["module"] = att.name(int(att.module[row]))
                pin["tensor"] = att.name(int(att.label[row]))
                pin["site"] = site(att.capture, int(att.stack[row]))
            pins.append(pin)
        out.append({"address": s.address, "total_size": s.total_size, "stream": s.stream, "pool": s.pool_kind,
                    "free": free, "live_blocks": len(live), "pinned_by": pins})
    return out


def allocator_section(cap: Capture, att: Attribution | None, rep: Replay, *, at: int | None = None, top: int = 5,
                      points: int = 256) -> dict[str, Any]:
    """The report's `allocator` section (docs/report.md). at: the event
    whose state to show (replay(..., states_at=[at])); default the peak."""
    peak = rep.peak_event("reserved")
    state = rep.states.get(peak if at is None else at)
    out: dict[str, Any] = {
        "settings": rep.config.describe(),
        "replay": rep.fidelity.to_json() if rep.fidelity else None,
        "peak_reserved": {"event": peak, "bytes": rep.peak_reserved},
        "state_at": peak if at is None else at,
        "stats": rep.stats(),
        "replayed_until": rep.replayed_until,
        "timeline": {  # up to the last replayed event
            "reserved": _downsample(rep.reserved[:rep.replayed_until + 2], points),
            "allocated": _downsample(rep.allocated[:rep.replayed_until + 2], points),
            "cached_free": _downsample(rep.cached_free[:rep.replayed_until + 2], points),
            "largest_free_block": _downsample(rep.largest_free[:rep.replayed_until + 2], points),
        },
        "warnings": list(rep.warnings),
    }
    if state is not None:
        out["state"] = figures(state)
        out["state"]["pinned_segments"] = pinning_blocks(state, att, top=top)
    return out


def oom_section(cap: Capture, att: Attribution | None, rep: Replay, *, top: int = 10,
                try_settings: bool = True) -> dict[str, Any] | None:
    """The post-mortem of the capture's first OOM, or None if it had none."""
    recorded = [o for o in rep.ooms if o.recorded]
    oom_events = np.flatnonzero(cap.events.kind == EventKind.OOM)
    if not len(oom_events):
        return None
    e = int(oom_events[0])
    ev = cap.events
    o = next((r for r in recorded if r.event == e), None)
    frames = cap.stack(int(ev.stack[e]))
    base = device_readings(cap) or {}
    total = next((int(d["total"]) for d in base.get("devices") or () if "total" in d), None)
    device_free = int(ev.arg[e])
    out: dict[str, Any] = {
        "event": e,
        "request": {"size": int(ev.size[e]) or int(ev.block[e]), "rounded": int(ev.block[e]) or None,
                    "stack": [str(f) for f in frames[:top]],
                    "frames": [{"function": f.function, "file": f.filename, "line": f.line,
                                "package": package_of(f.filename)} for f in frames]},
        "where": oom_where(cap, att, e),
        "device": {"total": total, "free_at_oom": device_free},
        "reproduced_by_replay": o is not None,
    }
    if o is None:
        out["note"] = ("the replay served this request: the allocator's state here is not the recorded one "
                       "(see allocator.replay)")
        return out
    fig = figures(o.segments)
    out["request"]["stream"] = o.stream
    out["device"]["allowed"] = o.allowed
    out["allocator"] = fig
    if total is not None:
        out["device"]["outside_pytorch"] = total - device_free - o.reserved
    out["cached_unusable"] = stranded(o.segments, device=o.device, stream=o.stream, rounded=o.rounded,
                                      config=rep.config)
    out["pinned_segments"] = pinning_blocks(o.segments, att, top=5)
    out["empty_cache_would_help"] = False  # torch released every unsplit cached block before it gave up
    if att is not None:
        m = moment(att, e, None, top)
        out["filled_by"] = {"categories": m.by_category, "modules": dict(list(m.by_module.items())[:top])}
    short = shortfall(o, rep.config)
    if short is not None:
        out["shortfall"] = short
    out["would_fit"] = would_fit(cap, out, o, att.watches_at(e) if att is not None else [],
                                 rep.config.large_segment_size)
    if try_settings:
        tried = []
        for text, cfg in candidates(cap)[1:]:
            r = replay(cap, cfg)
            tried.append({"settings": text, "avoids_oom": e in r.avoided_ooms and not any(
                x.event < e for x in r.ooms), "peak_reserved": r.peak_reserved})
        out["settings_tried"] = tried
    return out


def oom_where(cap: Capture, att: Attribution | None, e: int) -> dict[str, Any]:
    """Where the run was when event e (an OOM) happened: the phase and the
    optimizer step (a watched model's), the op chain and the autograd node
    (ops recorded), the module scope open on its thread, the last mark
    before it, and the user's line of its stack (in backward: of the
    forward op that made the node)."""
    ev = cap.events
    out: dict[str, Any] = {}
    thread = int(ev.thread[e])
    if thread < len(cap.threads):
        out["thread"] = cap.threads[thread].name
    if att is not None and len(att.phase_starts):
        i = int(np.searchsorted(att.phase_starts, e, side="right")) - 1
        if i >= 0 and att.phase_names[i] in ("forward", "backward", "optimizer"):
            out["phase"], out["step"] = att.phase_names[i], int(att.phase_iterations[i])
    if "phase" not in out and out.get("thread", "").startswith("pt_autograd_"):
        out["phase"] = "backward"  # (the autograd engine's device thread, named so by torch; no watch said which step)
    op = int(ev.op[e])
    if op:
        name = op_names(cap, np.array([op]))[op]
        out["op"] = " > ".join(name.chain)
        if name.backward_node:
            out["autograd_node"] = name.backward_node
    module = module_at(cap, e)
    if module:
        out["module"] = module
        out["module_label"] = module_label(module, att.module_classes if att is not None else {})
    marks = np.flatnonzero(ev.kind[:e] == EventKind.MARK)
    if len(marks):
        out["mark"] = cap.label(int(marks[-1]))
    line = site(cap, int(ev.stack[e]))
    if line:
        out["site"] = line
    return out


def allocator_lines(a: dict[str, Any] | None, top: int) -> list[str]:
    """The text of the allocator section (build_report's "allocator"; none: no lines)."""
    if not a:
        return []
    lines = ["", f"Allocator (settings: {a['settings']}), at the peak of reserved memory (event {a['state_at']}):"]
    st = a.get("state")
    if st:
        lines += table([
            ("reserved", format_bytes(st["reserved"]), f"{st['segments']} segments"),
            ("allocated", format_bytes(st["allocated"]), f"of which rounding and unsplit remainders "
             f"{format_bytes(st['internal_fragmentation'])}"),
            ("cached free", format_bytes(st["cached_free"]), f"largest block {format_bytes(st['largest_free_block'])}, "
             f"external fragmentation {st['external_fragmentation']:.1%}"),
            ("unreleasable", format_bytes(st["unreleasable_free"]), f"free inside {st['fragmented_segments']} "
             "segments that also hold live blocks (empty_cache cannot return it)"),
            ("awaiting streams", format_bytes(st["pending_free"]), "freed, still in use by another stream"),
            *([("private pools", format_bytes(st["private_pools"]["reserved"]),
                f"{st['private_pools']['segments']} segments of CUDA graphs' (and MemPools') own pools, "
                f"{format_bytes(st['private_pools']['allocated'])} allocated")]
              if st.get("private_pools", {}).get("segments") else []),
        ], {1})
        for seg in st["pinned_segments"][:3]:
            lines.append(f"  segment {seg['address']:#x} ({format_bytes(seg['total_size'])}, {seg['pool']} pool): "
                         f"{format_bytes(seg['free'])} free, pinned by {seg['live_blocks']} live block(s):")
            for p in seg["pinned_by"][:3]:
                what = " ".join(x for x in (p.get("category"), p.get("module"), p.get("tensor")) if x)
                lines.append(f"    {format_bytes(p['size'])} {what or p['state']} {p.get('site') or ''}".rstrip())
    rp = a.get("replay")
    if rp:
        verdict = "reproduced exactly" if rp["exact"] else \
            f"NOT reproduced exactly ({rp['matched']} of {rp['recorded_segment_events']} segment events)"
        lines.append(f"  replay of the allocator: {verdict}; see `allocscope simulate`")
    return lines


_PHASE_WORDS = {"forward": "the forward", "backward": "the backward", "optimizer": "the optimizer step"}


def where_sentence(where: dict[str, Any]) -> str:
    """Where a run ran out, in words: "ran out in the backward of step 0, at
    ReluBackward0, whose forward ran at big.py:6 (<module>)"."""
    words = "ran out"
    if where.get("phase"):
        words += f" in {_PHASE_WORDS[where['phase']]}" + (f" of step {where['step']}" if "step" in where else "")
    node, line = where.get("autograd_node"), where.get("site")
    if node and line:
        words += f", at {node}, whose forward ran at {line}"
    elif node or line:
        words += f", at {node or line}"
    return words


def oom_lines(o: dict[str, Any] | None, top: int, stacks: str = "folded") -> list[str]:
    """The text of an OOM post-mortem (build_report's "oom"; none: no
    lines). stacks: "folded" (the user's frames, each run of a package's
    frames as one line: capture.stacks.folded_stack) or "full" (every frame)."""
    if not o:
        return []
    req = o["request"]
    lines = ["", f"Out of memory at event {o['event']}: requested {format_bytes(req['size'])}"]
    where = o.get("where") or {}
    if where:
        lines.append(f"  {where_sentence(where)}")
    rows = [(label, where[key]) for label, key in (("module", "module_label"), ("op", "op"), ("after mark", "mark"))
            if where.get(key)]
    frames = [Frame(f["file"], f["function"], f["line"]) for f in req["frames"]] if "frames" in req else None
    shown = (folded_stack(frames) if stacks == "folded" else [str(f) for f in frames]) if frames is not None \
        else req["stack"][:5]
    if not shown and where.get("phase") == "backward" and not where.get("op"):
        # Autograd's threads run no Python: the forward line comes with the op recording.
        shown = ["<none: the backward runs on a thread without Python frames; `allocscope run` (without "
                 "--no-watch, or with --ops) records the autograd node and the forward line that made it>"]
    rows += [("stack" if i == 0 else "", text) for i, text in enumerate(shown or ["<no stack>"])]
    lines += table(rows, set())
    if not o["reproduced_by_replay"]:
        return lines + [f"  {o['note']}"]
    al, dev = o["allocator"], o["device"]
    rows = [("reserved", format_bytes(al["reserved"]), f"allocated {format_bytes(al['allocated'])}")]
    if dev.get("outside_pytorch") is not None:
        rows.append(("outside PyTorch", format_bytes(dev["outside_pytorch"]), "CUDA context, libraries, other processes"))
    rows.append(("device free", format_bytes(dev["free_at_oom"]), f"of {format_bytes(dev['total'] or 0)}"
                 + (f"; allowed {format_bytes(dev['allowed'])}" if dev.get("allowed") else "")))
    lines += table(rows, {1})
    unusable = {k: v for k, v in o["cached_unusable"].items() if v}
    if unusable:
        lines.append("  cached but unusable for this request: " + ", ".join(
            f"{format_bytes(v)} {k.replace('_', ' ')}" for k, v in unusable.items()))
    filled = (o.get("filled_by") or {}).get("categories") or {}
    parts = [f"{c} {format_bytes(b)}" for c, b in sorted(filled.items(), key=lambda kv: -kv[1]) if b]
    if parts:
        lines.append("  filled by: " + ", ".join(parts))
    if o.get("shortfall") is not None:
        lines.append(f"  short by {format_bytes(o['shortfall'])}; empty_cache() would not have helped "
                     "(torch had released every unsplit cached block)")
    for t in o.get("settings_tried", []):
        lines.append(f"  with {t['settings']}: {'would fit' if t['avoids_oom'] else 'still runs out'} "
                     f"(peak reserved {format_bytes(t['peak_reserved'])})")
    return lines + would_fit_lines(o.get("would_fit"))


def would_fit_lines(w: dict[str, Any] | None) -> list[str]:
    """What would fit, as text (oom_lines)."""
    if not w:
        return []
    name, value = w["name"], w.get("value")
    if "searched" in w:
        return [f"  a search found {name}={w['searched']} the largest that fits on this card (this run: {name}={value})"
                if w["searched"] is not None else f"  this run was {name}={value} of a search (fit.json beside the "
                                                  "capture has its answer)"]
    lines = []
    if w.get("estimate") is not None:
        lines.append(f"  what would fit: {name}={w['estimate']:,} or so, an estimate from this run alone: the "
                     f"{format_bytes(w['needed_bytes'])} it needed when it ran out at {name}={value:,}, "
                     f"{format_bytes(w['fixed_bytes'] + w['later_bytes'])} of it fixed (parameters, gradients, "
                     "optimizer state, workspaces), the rest in proportion; what it needs after that point is not "
                     "in it")
    lines.append(f"  to find it: {w['command']}")
    return lines
