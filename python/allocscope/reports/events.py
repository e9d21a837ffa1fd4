"""The events of a capture as rows (`allocscope dump`): one JSON-ready dict
per event, and its line of text."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np

from ..capture.format import FIRST_ANNOTATION, EventKind, kind_name
from ..capture.reader import Capture

__all__ = ["event_rows", "render_event"]


def event_rows(cap: Capture, *, kinds: Sequence[str] = (), limit: int | None = None,
               stacks: bool = False) -> Iterator[dict[str, Any]]:
    """One JSON-ready dict per event in sequence order (what `allocscope dump
    --json` prints): only `kinds` (names as kind_name spells them) if given,
    at most `limit`, with each event's frames if `stacks`."""
    ev = cap.events
    index = np.arange(len(ev))
    if kinds:
        index = index[np.isin(ev.kind, [EventKind[k.upper()] for k in kinds])]
    if limit is not None:
        index = index[: max(limit, 0)]
    t0 = int(ev.time_ns[0]) if len(ev) else 0
    for i in index.tolist():
        kind = int(ev.kind[i])
        stream = cap.streams[int(ev.stream[i])]
        thread = cap.threads[int(ev.thread[i])]
        row: dict[str, Any] = {
            "seq": int(ev.seq[i]), "time_ns": int(ev.time_ns[i]) - t0, "kind": kind_name(kind),
            "via_allocator": bool(ev.via_allocator[i]), "device": int(ev.device[i]), "stream": stream.handle,
            "thread": thread.native_id, "addr": int(ev.addr[i]), "size": int(ev.size[i]),
            "block": int(ev.block[i]), "stack": int(ev.stack[i]), "arg": int(ev.arg[i]), "op": int(ev.op[i]),
        }
        if row["op"]:  # outermost first, as the reports name them
            row["ops"] = [f.function for f in reversed(cap.stack(row["op"]))]
        if kind >= FIRST_ANNOTATION:
            row["label"] = cap.label(i)
        if stacks:
            row["frames"] = [[f.filename, f.function, f.line] for f in cap.stack(int(ev.stack[i]))]
        yield row


def render_event(row: dict[str, Any]) -> str:
    """One event row as a line of text (its frames on the lines after it)."""
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
    if row.get("ops"):
        parts.append("op=" + " > ".join(row["ops"]))
    line = " ".join(parts)
    for filename, function, lineno in row.get("frames", []):
        line += f"\n{'':>12}{function} ({filename}:{lineno})"
    return line
