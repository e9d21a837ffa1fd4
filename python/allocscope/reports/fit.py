"""The `fit` document: one command run on several virtual cards (`allocscope
fit`), and for each card whether it fits, its peaks, the room left, what
filled memory at the peak and, where it ran out, the post-mortem
(card_result, fit_document; schema FIT_SCHEMA, written down in
docs/report.md), with its text rendering (render_fit).

A card's verdict:
  fits             the command exited with status 0 and no allocation failed;
  out of memory    an allocation failed (an OOM event was recorded), whether
                   or not the command caught the error, or a serving engine
                   refused to start for want of memory (its log says so:
                   reports/serving.py);
  failed           the command exited with another status and nothing ran out
                   of memory: it failed for another reason, which says
                   nothing about memory;
  no capture       the command never used CUDA (nothing was recorded).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..allocator.config import recorded_config
from ..allocator.replay import replay
from ..allocator.whatif import largest_total
from ..attribution.categories import CATEGORIES, module_label
from ..attribution.kv_cache import kv_cache_allocations
from ..attribution.ops import op_names
from ..capture.baselines import closing_baseline, device_readings, nccl_memory, outside_at_peak
from ..capture.format import EventKind
from ..capture.reader import Capture, load
from ..common.units import format_bytes
from .allocator import oom_lines, shortfall
from .analysis import analyse
from .report import build_report
from .scaling import FIXED_CATEGORIES, model_lines
from .sections import kv_cache_lines, waterfall_lines
from .serving import engine_figures, serving_lines, serving_side_by_side
from .text import table
from .what_fits import FIT_DOCUMENT, search_card_beside

__all__ = ["FIT_DOCUMENT", "FIT_SCHEMA", "FitDocument", "card_lines", "card_result", "caveats", "fit_document",
           "foreseen_result", "render_fit", "render_search", "run_result", "search_document", "searched_memory"]

FIT_SCHEMA = "allocscope.fit/1"


class FitDocument(dict):
    """The fit document: a dict, as JSON has it, that a notebook shows as
    its text (allocscope.fit(...) as a cell's last expression)."""

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(render_search(self) if 'search' in self else render_fit(self))}</pre>"


def _device(cap: Capture) -> dict[str, Any]:
    base = device_readings(cap) or {}
    devices = base.get("devices") or [{}]
    return devices[0] if isinstance(devices[0], dict) else {}


# Left free by the KV cache that fills the card: a run started with it is
# not quite the run replayed. Two identical vLLM runs on the virtual A100
# differed by 4 MiB at their peak; and vLLM given --kv-cache-memory skips
# its CUDA-graph memory profile, which leaves the allocator's cached
# segments otherwise arranged: with Qwen1.5-MoE on an A100, the run started
# with the replay's figure less 32 MiB ran out (its own replay: 16 MiB less
# would have fitted); less 64 MiB, it fits with 36 MiB to spare.
_FILL_MARGIN = 64 << 20


def _kv_cache_with_headroom(out: dict[str, Any], cap: Capture, r: dict[str, Any], capacity: int) -> None:
    """A fit card's kv_cache "with_headroom": the cache that takes all of
    the headroom (a serving engine sizes its cache once, before it serves:
    vLLM's kv_cache_memory_bytes), in whole MiB, less _FILL_MARGIN. Where
    the replay of the run is exact, the largest cache with which it still
    replays without running out on this card (what comes after the cache,
    fragmentation included, decides: allocator/whatif.py); else the cache
    plus the headroom."""
    kv = out["kv_cache"]
    grown = kv["most_bytes"] + out["headroom_bytes"]
    kv["with_headroom_basis"] = "headroom"
    replayed = ((r.get("allocator") or {}).get("replay") or {}).get("exact")
    allocs = kv_cache_allocations(cap, int(r["peak"]["event"])) if r.get("serving") and replayed else []
    if allocs:
        # (a little past the headroom: cached blocks freed under pressure give some back)
        largest = largest_total(cap, allocs, capacity=capacity, upper=grown + (64 << 20))
        if largest is not None:
            grown = largest - (int(cap.events.size[allocs].astype(np.int64).sum()) - kv["most_bytes"])
            kv["with_headroom_basis"] = "replay"
    grown = max(grown - _FILL_MARGIN, kv["most_bytes"]) >> 20 << 20
    kv["with_headroom_bytes"] = grown
    if kv.get("shape"):
        kv["with_headroom_tokens"] = grown // kv["shape"]["bytes_per_token"]


def card_result(gpu: str, status: int, cap: Capture | None, *, capture_path: str | None = None,
                top: int = 5, report: dict[str, Any] | None = None, log: str = "") -> dict[str, Any]:
    """One card's entry of the fit document. status: the command's exit
    status; cap: the capture of its process (of several, the one
    harness/fit.py chose), None if none was written;
    report: its build_report(cap), where already made; log: the run's
    output, where a serving engine logs its own figures (reports/serving.py)."""
    out: dict[str, Any] = {"gpu": gpu, "exit_status": status, "capture": capture_path}
    said = engine_figures(log) if log else None
    if cap is None:
        return out | {"verdict": "no capture"}
    ooms = int((cap.events.kind == EventKind.OOM).sum())
    refused = status != 0 and said is not None and said.get("refusal") is not None
    # A damaged capture's read stopped early: what it read cannot say the rest fit.
    out["verdict"] = ("out of memory" if ooms or refused else "damaged capture" if cap.damaged
                      else "fits" if status == 0 else "failed")
    out["ooms"] = ooms
    an = None
    if report is None:
        an = analyse(cap)
        report = build_report(cap, top=top, analysis=an)
    r = report
    total = _device(cap).get("total")
    base = closing_baseline(cap)  # as the waterfall reads it
    outside = outside_at_peak(base) if base else None
    peak_reserved = (r.get("peak_reserved") or {}).get("reserved_bytes")
    out["total_bytes"] = total
    out["peak_allocated_bytes"] = r["peak"]["allocated_bytes"]
    out["peak_reserved_bytes"] = peak_reserved
    out["outside_allocator_bytes"] = outside
    nccl = nccl_memory(base) if base else None
    if nccl is not None:
        out["nccl_bytes"] = nccl[1]  # part of outside_allocator_bytes: NCCL's buffers at their most
    # Room left at the peak where it fits; where it ran out, how much was missing.
    out["headroom_bytes"] = (None if total is None or peak_reserved is None or outside is None or ooms
                             else int(total) - peak_reserved - outside)
    out["shortfall_bytes"] = (r.get("oom") or {}).get("shortfall")
    if refused and not ooms:  # the engine's own reckoning, not an allocation that failed
        out["headroom_bytes"] = None
        out["shortfall_bytes"] = said["refusal"]["shortfall_bytes"]
    # What filled memory: at the peak of allocated memory, the moment the
    # sites are of too (the reserved peak can come where little is allocated).
    focus = r["peak"]
    out["peak"] = {
        "event": focus["event"],
        "by_category": {c: b for c, b in sorted(focus["by_category"].items(), key=lambda kv: -kv[1]) if b},
        "by_module": dict(list(focus["by_module"].items())[:top]),
        "module_classes": r["module_classes"],
        "sites": [{"site": s["site"], "live_bytes": s["live_bytes"]} for s in r["sites"][:top] if s["live_bytes"]],
    }
    out["watched"] = r["capture"]["watched"]
    out["virtual_gpu_values"] = r["capture"].get("virtual_gpu_values")  # what the numbers assume (docs/vgpu.md)
    # The textbook estimate beside the measured figure, and the waterfall
    # between them (needs a watched model: the estimate counts its tensors).
    out["estimate"] = None if not out["watched"] else {
        "textbook_bytes": r["theory"]["total"], "measured_bytes": r["measured"]["total_bytes"],
        "basis": r["measured"]["basis"], "theory": r["theory"], "gap": [g for g in r["gap"] if g["bytes"]],
        "measured": r["measured"]}
    if r.get("kv_cache"):
        out["kv_cache"] = dict(r["kv_cache"])
        if out["verdict"] == "fits" and out["headroom_bytes"] is not None and out["headroom_bytes"] > 0:
            _kv_cache_with_headroom(out, cap, r, int(total) - outside)
    serving = serving_side_by_side(r.get("serving"), said, out.get("kv_cache"))
    if serving is not None:
        out["serving"] = serving
        if serving.get("room_bytes") is not None and out["verdict"] == "fits":
            out["search_headroom_bytes"] = serving["room_bytes"]  # (fit --search: harness/search.py)
    if "oom" in r:
        out["oom"] = r["oom"]
    out["warnings"] = r["warnings"]
    out["caveats"] = caveats(cap)
    if an is not None:  # for fit --search's model of memory against the value (reports/scaling.py)
        out["largest_growing_request_bytes"] = _largest_growing_request(an.att)
        if an.replay is not None:
            out["max_split_size"] = an.replay.config.max_split_size
    return out


def run_result(gpu: str, status: int, cap: Capture | None, *, capture_path: str | None, top: int,
               value: int | None = None, routing: str | None = None, rank: int | None = None,
               role: str | None = None, log: str = "") -> dict[str, Any]:
    """The entry of one run the harness made (harness/fit.py): card_result,
    led by what the run was, where it was one of several on the card: the
    searched value, the MoE routing, the rank of a job (and its role in it:
    "stage 3 of 4; pp 3/4, tp 0/2", vgpu/roles.py)."""
    lead = {k: v for k, v in (("value", value), ("routing", routing), ("rank", rank), ("role", role))
            if v is not None}
    return lead | card_result(gpu, status, cap, capture_path=capture_path, top=top, log=log)


def foreseen_result(value: int, ran: dict[str, Any], total: int) -> dict[str, Any]:
    """A searched value's entry on a card of `total` bytes, foreseen without
    a run from the run `ran` made at that value on a larger card of the same
    chip (the same requests in the same order: torch sees the same device
    but for its memory): out of memory there is out of memory here; a run
    that fit is replayed with this card's memory."""
    if ran["verdict"] != "fits":
        return {"value": value, "verdict": "out of memory", "replayed_from": ran["capture"]}
    cap = load(ran["capture"])
    rep = replay(cap, recorded_config(cap.baseline("start"), cap.metadata), limit=total)
    outside = ran.get("outside_allocator_bytes") or 0
    return {"value": value, "verdict": "out of memory" if rep.ooms else "fits",
            "peak_reserved_bytes": rep.peak_reserved, "replayed_from": ran["capture"],
            "headroom_bytes": None if rep.ooms else total - rep.peak_reserved - outside,
            "shortfall_bytes": shortfall(rep.ooms[0], rep.config) if rep.ooms else None}


def _largest_growing_request(att: Any) -> int | None:
    """The largest request of what may grow with a batch: any category but
    those a step holds whatever its batch (reports/scaling.py)."""
    fixed = [CATEGORIES.index(c) for c in FIXED_CATEGORIES]
    rows = np.flatnonzero((att.start >= 0) & ~np.isin(att.category, fixed))
    return int(att.size[rows].max()) if len(rows) else None


# Ops through which torch calls cuDNN's convolutions.
_CUDNN_OPS = frozenset({"aten::convolution", "aten::_convolution", "aten::conv_transpose2d",
                        "aten::conv_transpose3d", "aten::convolution_backward"})


def caveats(cap: Capture) -> list[str]:
    """Where a dry run on the virtual GPU is known to differ from the card:
    what the capture ran that the virtual card does not model."""
    virtual = cap.metadata.get("virtual_gpu")
    if not virtual:
        return []
    ev = cap.events
    ops = np.unique(ev.op[(ev.kind == EventKind.ALLOC) & (ev.op != 0)])
    if not any(_CUDNN_OPS.intersection(name.chain) for name in op_names(cap, ops).values()):
        return []
    cudnn = virtual.get("cudnn")
    if cudnn is None or not cudnn.get("stand_in"):
        return ["convolutions ran on torch's native kernels: this virtual GPU has no cuDNN, whose workspaces "
                "reserve more on a card (ResNet-50 on an H100: 10.9% more than its dry run; docs/fit.md)"]
    cards = {d.get("name") for d in cap.metadata.get("cuda_devices") or ()}
    rows = cudnn.get("table_rows") or {}
    missing = sorted(c for c in cards if c and not rows.get(c))
    if missing:
        return [f"convolutions ran through cuDNN, whose workspaces come from tables recorded on cards: the tables "
                f"hold none for {', '.join(missing)}, so they asked for no workspace (ResNet-50 on an H100 "
                "reserved 10.9% more than such a dry run; docs/vgpu.md, cuDNN)"]
    return []


def fit_document(command: list[str], cards: list[dict[str, Any]], world: int | None = None) -> dict[str, Any]:
    """world: the job's size when each card entry is one rank of it: the
    document then gains per card the job's verdict, its worst rank's."""
    doc = FitDocument(schema=FIT_SCHEMA, command=list(command), units="bytes", cards=cards,
                      fits_everywhere=all(c["verdict"] == "fits" for c in cards))
    if world is not None:
        doc["world_size"] = world
        gpus = dict.fromkeys(c["gpu"] for c in cards)
        doc["jobs"] = [_job(gpu, [c for c in cards if c["gpu"] == gpu]) for gpu in gpus]
    return doc


_VERDICT_ORDER = {"fits": 0, "failed": 1, "damaged capture": 2, "no capture": 2, "out of memory": 3}


def _job(gpu: str, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """A job's verdict on a card: its worst rank's (out of memory before a
    failure before a fit; among fits, the least headroom)."""
    worst = max(ranks, key=lambda c: (_VERDICT_ORDER.get(c["verdict"], 1), -(c.get("headroom_bytes") or 0)))
    return {"gpu": gpu, "verdict": worst["verdict"], "worst_rank": worst["rank"], "worst_role": worst.get("role"),
            "peak_reserved_bytes": worst.get("peak_reserved_bytes"), "headroom_bytes": worst.get("headroom_bytes"),
            "ranks": [c["rank"] for c in ranks]}


def _size(n: int | None) -> str:
    return "?" if n is None else format_bytes(n)


def render_fit(doc: dict[str, Any], top: int = 5, *, stacks: str = "folded") -> str:
    lines = [f"allocscope fit: {' '.join(doc['command'])}"]
    assumed = {(v.get("compute"), v.get("routing")) for c in doc["cards"] if (v := c.get("virtual_gpu_values"))}
    if len(assumed) == 1 and not any(c.get("routing") for c in doc["cards"]):
        compute, routing = assumed.pop()
        lines.append(f"values computed on the virtual GPU: {compute}; MoE routing where a router's logits were not "
                     f"computed: {routing} (--compute, --routing; docs/vgpu.md, \"Values\")")
    lines.append("")
    roles = any(c.get("role") for c in doc["cards"])
    rows = [("GPU", "verdict", "peak allocated", "peak reserved", "headroom", "card", *(("role",) if roles else ()))]
    for c in doc["cards"]:
        verdict = c["verdict"] + (f" (exit {c['exit_status']})" if c["verdict"] == "failed" else "")
        room = _size(c.get("headroom_bytes"))
        if c.get("shortfall_bytes") is not None:
            room = f"short by {format_bytes(c['shortfall_bytes'])}"
        rows.append((_card_name(c), verdict, _size(c.get("peak_allocated_bytes")),
                     _size(c.get("peak_reserved_bytes")), room, _size(c.get("total_bytes")),
                     *((c.get("role") or "",) if roles else ())))
    lines += table(rows, {2, 3, 4, 5})
    for job in doc.get("jobs") or ():
        role = f" ({job['worst_role']})" if job.get("worst_role") else ""
        lines.append(f"the job of {doc['world_size']} ranks on {job['gpu']}: {job['verdict']} "
                     f"(its worst rank of {len(job['ranks'])} run: rank {job['worst_rank']}{role})")
    for c in doc["cards"]:
        if c["verdict"] == "no capture":
            lines += ["", f"{_card_name(c)}: no capture was written: the command never used CUDA "
                          f"(exit status {c['exit_status']})"]
        if c["verdict"] == "damaged capture":
            lines += ["", f"{_card_name(c)}: its capture is damaged: {'; '.join(c['warnings'][:1])}"]
        if "peak" in c:
            lines += ["", f"{_card_name(c)}:"] + card_lines(c, top, stacks=stacks)
    return "\n".join(lines)


def _card_name(c: dict[str, Any]) -> str:
    name = c["gpu"] if c.get("rank") is None else f"{c['gpu']} rank {c['rank']}"
    return name if c.get("routing") is None else f"{name}, {c['routing']} routing"


def card_lines(c: dict[str, Any], top: int = 5, *, stacks: str = "folded") -> list[str]:
    """What filled one card's memory (indented lines): the peak's breakdown,
    the estimate beside it, the OOM post-mortem and where the capture is."""
    lines = []
    if c["peak"]["event"] < 0:
        lines.append("  nothing was allocated")
    else:
        lines += _peak_lines(c, top)
    lines += ["  " + line for line in kv_cache_lines(c.get("kv_cache"))]
    grown = (c.get("kv_cache") or {}).get("with_headroom_bytes")
    if grown:
        tokens = c["kv_cache"].get("with_headroom_tokens")
        lines.append(f"    with all of the headroom, a KV cache of {format_bytes(grown)}" +
                     (f" ({tokens:,} tokens)" if tokens is not None else "") +
                     f" would fill the card but {format_bytes(_FILL_MARGIN)}, where a run with it allocates as "
                     "this one did"
                     + (" (the largest with which this run's replay runs out nowhere, less that)"
                        if c["kv_cache"].get("with_headroom_basis") == "replay" else "") +
                     f" (vLLM: kv_cache_memory_bytes={grown})")
    lines += ["  " + line for line in serving_lines(c.get("serving"))]
    if c["verdict"] == "failed":
        lines.append(f"  the command failed (exit status {c['exit_status']}) without running out of memory: "
                     "its verdict says nothing about memory")
    lines += ["  " + line if line else line for line in oom_lines(c.get("oom"), top, stacks)]
    lines += [f"  caveat: {text}" for text in c.get("caveats", [])]
    if c.get("capture"):
        lines.append(f"  capture: {c['capture']} (allocscope report / html / simulate)")
    return lines


def _peak_lines(c: dict[str, Any], top: int) -> list[str]:
    lines = [f"  at the peak of allocated memory (event {c['peak']['event']}):"]
    if c["watched"]:
        lines.append("    by category: " + ", ".join(f"{k} {format_bytes(v)}" for k, v in
                                                      list(c["peak"]["by_category"].items())[:top]))
        classes = c["peak"].get("module_classes", {})
        lines.append("    by module: " + ", ".join(f"{module_label(k, classes)} {format_bytes(v)}"
                                                    for k, v in c["peak"]["by_module"].items()))
    else:
        lines.append("    no model was watched (no torch.nn.Module with parameters ran): no categories or modules, "
                     "only source lines")
    for s in c["peak"]["sites"]:
        lines.append(f"    {format_bytes(s['live_bytes']):>11}  {s['site']}")
    est = c.get("estimate")
    if est:
        lines.append("  the textbook estimate against the measured peak:")
        lines += ["  " + line for line in waterfall_lines(est["theory"], est["gap"], est["measured"])]
    return lines


# ---- the largest value that fits (fit --search)


def search_document(command: list[str], name: str, low: int, high: int,
                    cards: list[dict[str, Any]]) -> dict[str, Any]:
    """cards: {gpu, **harness.search.search_largest(...)} per card."""
    return FitDocument(schema=FIT_SCHEMA, command=list(command), units="bytes",
                       search={"name": name, "low": low, "high": high}, cards=cards,
                       fits_everywhere=all(c["largest"] is not None for c in cards))


def searched_memory(capture_path: str, gpu: str, name: str) -> dict[str, Any] | None:
    """The memory model of card `gpu` from the fit document beside a
    search's capture (FIT_DOCUMENT), where there is one for that search; None
    otherwise (an older fit, a moved capture, a file that is not one)."""
    card = search_card_beside(capture_path, gpu, name) or {}
    memory = card.get("memory")
    return memory if isinstance(memory, dict) and memory.get("fixed_bytes") is not None else None


def render_search(doc: dict[str, Any]) -> str:
    name, low, high = doc["search"]["name"], doc["search"]["low"], doc["search"]["high"]
    lines = [f"allocscope fit: the largest {name} in {low}..{high} that fits: {' '.join(doc['command'])}", ""]
    rows = [("GPU", "largest", "peak reserved", "headroom", "next", "next's peak reserved", "runs")]
    for c in doc["cards"]:
        at, nxt = c["at_largest"] or {}, c["at_next"] or {}
        largest = f"{name}={c['largest']}" if c["largest"] is not None else f"none (not even {low})"
        shortfall = nxt.get("shortfall_bytes")
        rows.append((c["gpu"], largest, _size(at.get("peak_reserved_bytes")) if at else "",
                     _size(at.get("headroom_bytes")) if at else "",
                     str(c["largest"] + 1 if c["largest"] is not None else low) if nxt else "",
                     (_size(nxt.get("peak_reserved_bytes")) + (f", short by {format_bytes(shortfall)}"
                                                                if shortfall is not None else "")) if nxt else "",
                     str(c["runs"]) + (f" (+{len(c['replayed'])} replayed)" if c.get("replayed") else "")))
    lines += table(rows, {2, 3, 6})
    for c in doc["cards"]:
        if c.get("memory"):
            lines += ["", f"{c['gpu']}:"] + model_lines(c["memory"])
    lines.append("")
    lines.append("The search takes a value that fits to fit below it too. Each run's capture is kept "
                 "(allocscope report / html / simulate).")
    if any(c.get("replayed") for c in doc["cards"]):
        lines.append("Replayed: values answered by replaying a larger card's run at that value with the smaller "
                     "card's memory (same chip: the same requests); the largest value and the next were run.")
    for c in doc["cards"]:
        if not c.get("confirmed", True):
            lines.append(f"{c['gpu']}: a run disagreed with its replay (the program asks for memory by how much the "
                         "card has?), so the search went on with runs alone.")
    return "\n".join(lines)
