"""allocscope simulate: replay a CUDA capture through a model of the caching
allocator, with the recorded settings (fidelity) or others (what-if)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .._units import format_bytes, parse_bytes

NAME = "simulate"
HELP = "replay a CUDA capture through the caching allocator with other settings or a smaller GPU"
DESCRIPTION = """\
Replay every allocation, free and empty_cache() of a CUDA capture through a
model of PyTorch's caching allocator (docs/allocator.md). With the recorded
settings, the replay must reproduce the recorded segment events (cudaMalloc,
cudaFree, expandable map/unmap) exactly: this checks the model on your run.
With --config (any PYTORCH_CUDA_ALLOC_CONF string, as set for a fresh run:
what it leaves out takes torch's defaults) and/or --limit (the total
memory of a smaller GPU; memory outside PyTorch measured when recording still
counts), it predicts the peak reserved memory, the fragmentation at the peak,
and whether and where the run would have run out of memory. --suggest tries
the settings that matter and ranks them (runs that fit first, then by peak
reserved). The same requests are replayed in the same order: a run whose
allocations depend on how much memory is free (e.g. cuDNN autotuning) may
behave differently for real.

examples:
  allocscope simulate train.alsc
  allocscope simulate train.alsc --config expandable_segments:True
  allocscope simulate train.alsc --limit 24GiB --suggest
  allocscope simulate train.alsc --suggest --json | jq '.suggestions[0]'
"""

SCHEMA = "allocscope.simulate/1"


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="capture file (recorded on CUDA)")
    parser.add_argument("--config", metavar="SETTINGS",
                        help="allocator settings to try, as in PYTORCH_CUDA_ALLOC_CONF (e.g. expandable_segments:True)")
    parser.add_argument("--limit", metavar="SIZE", help="total memory of the GPU to simulate (e.g. 24GiB, 80GB)")
    parser.add_argument("--suggest", action="store_true", help="try the settings that matter and rank them")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args: argparse.Namespace) -> int:
    from .. import load
    from ..analysis.allocator_config import parse_alloc_conf, recorded_config
    from ..analysis.replay import recorded_reserved, replay
    from ..analysis.whatif import outcome, suggest

    limit = parse_bytes(args.limit) if args.limit else None
    if limit is not None and limit <= 0:
        raise ValueError("--limit must be positive")
    cap = load(args.file)
    recorded = recorded_config(cap.baseline("start"), cap.metadata)
    # As PYTORCH_CUDA_ALLOC_CONF for a fresh run: what the string leaves out takes torch's defaults.
    whatif_cfg = parse_alloc_conf(args.config) if args.config is not None else None
    faithful = replay(cap)
    measured = int(recorded_reserved(cap).max())
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "capture": {"path": cap.path, "events": len(cap.events), "torch": cap.metadata.get("torch")},
        "measured": {"peak_reserved": measured},
        "recorded": {"settings": recorded.describe(), "fidelity": faithful.fidelity.to_json() if faithful.fidelity
                     else None, "outcome": outcome(cap, faithful, recorded.describe()).to_json()},
    }
    if whatif_cfg is not None or limit is not None:
        cfg = whatif_cfg or recorded
        label = cfg.describe() + (f" on a {format_bytes(limit)} GPU" if limit else "")
        out["whatif"] = outcome(cap, replay(cap, cfg, limit=limit), label).to_json() | {"limit": limit}
    if args.suggest:
        out["suggestions"] = [o.to_json() for o in suggest(cap, limit=limit)]
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(render(out))
    return 0


def _pct(a: int, b: int) -> str:
    return "n/a" if b == 0 else f"{(a - b) / b * 100:+.1f}%"


def _describe(o: dict[str, Any], measured: int) -> list[str]:
    lines = [f"  peak reserved {format_bytes(o['peak_reserved'])} ({_pct(o['peak_reserved'], measured)} vs measured), "
             f"peak allocated {format_bytes(o['peak_allocated'])}",
             f"  at that peak: {format_bytes(o['cached_free_at_peak'])} cached free, external fragmentation "
             f"{o['external_fragmentation_at_peak']:.1%}; {o['num_device_alloc']} device allocations, "
             f"{o['num_alloc_retries']} release-and-retries"]
    if o["oom_count"]:
        first = o["ooms"][0]
        lines.append(f"  runs out of memory {o['oom_count']} time(s); first at event {first['event']} "
                     f"({first['time_ns'] / 1e9:.3f} s in), requesting {format_bytes(first['size'])} with "
                     f"{format_bytes(first['reserved'])} reserved, at {first['site'] or '?'}")
    else:
        lines.append("  does not run out of memory")
    if o["avoided_recorded_ooms"]:
        lines.append(f"  serves {o['avoided_recorded_ooms']} request(s) that ran out of memory when recorded")
    return lines


def render(r: dict[str, Any]) -> str:
    measured = r["measured"]["peak_reserved"]
    lines = [f"{r['capture']['path']}: {r['capture']['events']} events, measured peak reserved "
             f"{format_bytes(measured)}", ""]
    rec = r["recorded"]
    lines.append(f"Replay with the recorded settings ({rec['settings']}):")
    f = rec["fidelity"]
    if f:
        lines.append(f"  segment events reproduced: {f['matched']} of {f['recorded_segment_events']} recorded "
                     f"({f['simulated_segment_events']} simulated); blocks at another address: "
                     f"{f['address_mismatches']} of {f['allocations']}")
        snap = f["end_snapshot"]
        if snap is not None:
            lines.append(f"  end snapshot: {'identical' if snap['equal'] else 'DIFFERENT'} "
                         f"({snap['segments']} segments)")
        if f["first_mismatch"]:
            m = f["first_mismatch"]
            lines.append(f"  first difference at segment event {m['position']}: recorded {m['recorded']}, "
                         f"simulated {m['simulated']}")
        lines.append("  the model reproduces this run exactly" if f["exact"] else
                     "  the model does NOT reproduce this run exactly: treat what-if numbers as estimates")
    lines += _describe(rec["outcome"], measured)
    if "whatif" in r:
        w = r["whatif"]
        lines += ["", f"What if {w['settings']}:"] + _describe(w, measured)
    if "suggestions" in r:
        lines += ["", "Settings ranked (fits first, then by peak reserved):"]
        for k, o in enumerate(r["suggestions"], 1):
            verdict = f"runs out x{o['oom_count']}" if o["oom_count"] else "fits"
            lines.append(f"  {k}. {o['settings']}: peak reserved {format_bytes(o['peak_reserved'])} "
                         f"({_pct(o['peak_reserved'], measured)}), {verdict}")
    return "\n".join(lines)
