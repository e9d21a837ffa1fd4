"""allocscope dump: the events of a capture, one per line (for debugging)."""

from __future__ import annotations

import argparse
import json
from typing import Any, Iterator

NAME = "dump"
HELP = "print a capture's events as text or JSON lines"
DESCRIPTION = """\
Print the events of a capture in sequence order, as text or as JSON lines.

examples:
  allocscope dump step.alsc | head
  allocscope dump --kind alloc --kind oom --stacks step.alsc
  allocscope dump --json step.alsc > events.jsonl
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    from .._format import EventKind

    parser.add_argument("file", help="capture file")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--kind", action="append", metavar="KIND",
                        choices=[k.name.lower() for k in EventKind],
                        help="only events of this kind (repeatable): " + ", ".join(k.name.lower() for k in EventKind))
    parser.add_argument("--limit", type=int, metavar="N", help="stop after N events")
    parser.add_argument("--stacks", action="store_true", help="include each event's Python stack")


def _rows(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    import numpy as np

    from .. import load
    from .._format import FIRST_ANNOTATION, EventKind, kind_name

    cap = load(args.file)
    ev = cap.events
    index = np.arange(len(ev))
    if args.kind:
        index = index[np.isin(ev.kind, [EventKind[k.upper()] for k in args.kind])]
    if args.limit is not None:
        index = index[: max(args.limit, 0)]
    t0 = int(ev.time_ns[0]) if len(ev) else 0
    for i in index.tolist():
        kind = int(ev.kind[i])
        stream = cap.streams[int(ev.stream[i])]
        thread = cap.threads[int(ev.thread[i])]
        row: dict[str, Any] = {
            "seq": int(ev.seq[i]), "time_ns": int(ev.time_ns[i]) - t0, "kind": kind_name(kind),
            "via_allocator": bool(ev.via_allocator[i]), "device": int(ev.device[i]), "stream": stream.handle,
            "thread": thread.native_id, "addr": int(ev.addr[i]), "size": int(ev.size[i]),
            "block": int(ev.block[i]), "stack": int(ev.stack[i]), "arg": int(ev.arg[i]),
        }
        if kind >= FIRST_ANNOTATION:
            row["label"] = cap.label(i)
        if args.stacks:
            row["frames"] = [[f.filename, f.function, f.line] for f in cap.stack(int(ev.stack[i]))]
        yield row


def _text(row: dict[str, Any]) -> str:
    device = {-1: "cpu", -2: "-"}.get(row["device"], f"cuda:{row['device']}")
    kind = row["kind"] + ("*" if row["via_allocator"] else "")
    parts = [f"{row['seq']:>9}", f"{row['time_ns'] / 1e6:>12.3f}ms", f"{kind:<15}", f"{device:<7}"]
    if row["addr"]:
        parts.append(f"addr=0x{row['addr']:x}")
    if row["size"]:
        parts.append(f"size={row['size']}")
    if row["block"]:
        parts.append(f"block={row['block']}")
    if row["arg"] and "label" not in row:
        parts.append(f"arg={row['arg']}")
    if "label" in row:
        parts.append(f"label={row['label']!r}")
    if row["stack"]:
        parts.append(f"stack={row['stack']}")
    line = " ".join(parts)
    for filename, function, lineno in row.get("frames", []):
        line += f"\n{'':>12}{function} ({filename}:{lineno})"
    return line


def run(args: argparse.Namespace) -> int:
    if not args.json:
        print("# seq, time since first event, kind (* = seen only by the allocator's trace hook), device, fields")
    for row in _rows(args):
        print(json.dumps(row) if args.json else _text(row))
    return 0
