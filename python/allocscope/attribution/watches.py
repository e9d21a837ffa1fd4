"""The watched models, as a capture's WATCH events describe them
(docs/format.md): each watch's first event, and the updates that amend it
later (an optimizer found, a generate() call, the input shapes, the model
or an optimizer gone). A program that rebuilds its model (a benchmark that
retries at a smaller batch after an out-of-memory error) has had several
models, each alive for a while: the estimate of a moment counts the ones
alive then (watches_at)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..capture.format import EventKind

__all__ = ["Watches", "read_watches"]


@dataclass
class Watches:
    """Each watch's events: (event index, the event's fields), the first
    its WATCH, the rest its updates, in order."""

    histories: list[list[tuple[int, dict[str, Any]]]] = field(default_factory=list)

    def final(self) -> list[dict[str, Any]]:
        """Every watch, each with all its updates merged (a model gone has
        "gone": true)."""
        return [_merged(h) for h in self.histories]

    def at(self, event: int) -> list[dict[str, Any]]:
        """The watches whose model was alive after `event`, each as its
        updates up to there had made it, with an optimizer found later
        (auto-watch finds one at its first step, after it was made)."""
        out = []
        for history in self.histories:
            if history[0][0] > event:
                continue
            w = _merged([(i, fields) for i, fields in history if i <= event])
            if w.get("gone"):
                continue
            if not w.get("optimizer"):
                found = [u["optimizer"] for i, u in history if i > event and u.get("optimizer")]
                if found:
                    w["optimizer"] = found[0]
            out.append(w)
        return out


def _merged(history: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    out = dict(history[0][1])
    for _, update in history[1:]:
        out.update({k: v for k, v in update.items() if k != "update"})
    return out


def read_watches(kind: np.ndarray, string: Callable[[int], str], warnings: list[str]) -> Watches:
    """The watches of a capture's events; string(i): event i's label.
    An update names its watch by id (captures before ids: by name, the
    latest watch of that name)."""
    out = Watches()
    by_id: dict[Any, list[tuple[int, dict[str, Any]]]] = {}
    for i in np.flatnonzero(kind == EventKind.WATCH).tolist():
        try:
            fields = json.loads(string(i))
        except ValueError:
            warnings.append(f"event {i}: a WATCH annotation that is not JSON")
            continue
        if not isinstance(fields, dict):
            continue
        if not fields.get("update"):
            history = [(i, fields)]
            out.histories.append(history)
            if "id" in fields:
                by_id[fields["id"]] = history
            continue
        if "id" in fields:
            found = by_id.get(fields["id"])
        else:
            found = next((h for h in reversed(out.histories) if h[0][1].get("name") == fields.get("name")), None)
        if found is not None:
            found.append((i, fields))
    return out
