"""What would fit, said at an out-of-memory error (the report's `oom`,
`would_fit`): the value a search found where the run was one of a `fit
--search`; otherwise the command that finds it (the run's own command, the
value in it as `{NAME}`), and, where the value is known (the searched or
given `{NAME}`, or the batch: the leading dimension of the watched model's
first input), an estimate of the largest one from this run alone.

The estimate takes the memory the run needed when it ran out (reserved,
plus the segment the failing request would have taken) as a fixed part and
a part proportional to the value. Fixed: what holds the same bytes whatever
the batch (parameters, buffers, optimizer state, workspaces, and gradients
up to the trainable parameters' size), and the optimizer state the
watch's optimizer would still make (Adam: twice the trainable bytes), had
it not run yet. What the run would have needed after that point is not in
it: the estimate is an upper bound of sorts, labelled as one; a search runs
the command to find the answer.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from typing import Any

from ..allocator.sizes import allocation_size
from ..capture.reader import Capture

__all__ = ["FIT_DOCUMENT", "NAME", "PLACEHOLDER", "estimate_largest", "search_card_beside", "searched_largest",
           "would_fit"]

# Where fit leaves its document, beside the captures (reports/fit.py).
FIT_DOCUMENT = "fit.json"
# A value's name (fit --search NAME=LOW..HIGH) and its place in a command ({NAME})
NAME = r"[A-Za-z_][A-Za-z0-9_]*"
PLACEHOLDER = re.compile(r"\{(" + NAME + r")\}")
_FIXED = ("parameter", "buffer", "optimizer_state", "workspace")


def search_card_beside(capture_path: str, gpu: str | None, name: str) -> dict[str, Any] | None:
    """Card `gpu`'s entry in the fit document beside one of a search's
    captures (FIT_DOCUMENT), where that document is of a search of `name`;
    None otherwise (an older fit, a moved capture, a file that is not one)."""
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(capture_path)), FIT_DOCUMENT), encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("search"), dict) or doc["search"].get("name") != name:
        return None
    return next((c for c in doc.get("cards") or () if isinstance(c, dict) and c.get("gpu") == gpu), None)


def searched_largest(capture_path: str, gpu: str | None, name: str) -> int | None:
    """The largest value a search found for card `gpu` (search_card_beside); None where there is none."""
    card = search_card_beside(capture_path, gpu, name) or {}
    return card["largest"] if isinstance(card.get("largest"), int) else None


def _unit(fit: dict[str, Any], watches: list[dict[str, Any]]) -> tuple[str, int] | None:
    """(name, value) of what the run's memory is taken to grow with: the
    searched or given {NAME}, else the batch (the watched model's first
    input's leading dimension)."""
    if fit.get("search") and isinstance(fit.get("value"), int):
        return fit["search"], fit["value"]
    given = fit.get("placeholders") or {}
    if len(given) == 1:
        name, value = next(iter(given.items()))
        if str(value).isdigit() and int(value) > 0:
            return name, int(value)
    for w in watches:
        shapes = w.get("input_shapes")
        if isinstance(shapes, dict) and shapes:
            shape = shapes[sorted(shapes)[0]]
            if isinstance(shape, list) and shape and isinstance(shape[0], int) and shape[0] > 0:
                return "BATCH", shape[0]
    return None


def estimate_largest(value: int, needed: int, fixed: int, later: int, limit: int) -> int | None:
    """The largest value at which `limit` bytes hold `fixed` + `later` + the
    rest of `needed` scaled from `value` (None where the rest is not
    positive)."""
    grows = needed - fixed  # over `value` units (integers: no rounding at a boundary)
    if grows <= 0:
        return None
    return max(0, (limit - fixed - later) * value // grows)


def _command(cap: Capture, fit: dict[str, Any], name: str, value: int | None, gpu: str | None) -> str:
    """The command that searches for the largest value that fits: the
    run's own (fit's, with its {NAME}; else python and the script's
    arguments), the value where it gives it as {NAME}."""
    template = [str(a) for a in (fit.get("template") or fit.get("command")
                                 or ["python", *(cap.metadata.get("argv") or [])])]
    if not any(PLACEHOLDER.search(a) for a in template) and value is not None:
        template = [f"{{{name}}}" if a == str(value) else a for a in template]
    high = max(1, value - 1) if value else 1024
    line = f"allocscope fit --gpu {gpu or 'YOUR-GPU'} --search {name}=1..{high} -- {shlex.join(template)}"
    if not any(PLACEHOLDER.search(a) for a in template):
        line += f"  (with {{{name}}} where the command sets it, or the script reading the environment variable {name})"
    return line


def _gpu(cap: Capture, fit: dict[str, Any]) -> str | None:
    """The card as --gpu takes it, with its memory where the run gave it
    its own (fit --gpu-memory, --gpu H100-80GB:20GiB)."""
    virtual = cap.metadata.get("virtual_gpu") or {}
    spec = fit.get("gpu") or virtual.get("spec")
    devices = virtual.get("devices") or []
    if not spec or len(devices) != 1 or not isinstance(devices[0].get("total"), int) or ":" in spec:
        return spec
    total = devices[0]["total"]
    if devices[0].get("model_total") == total:  # (older captures do not say: their memory is given)
        return spec
    return f"{spec}:{total >> 20}MiB" if total % (1 << 20) == 0 else f"{spec}:{total}"


def would_fit(cap: Capture, oom: dict[str, Any], record: Any, watches: list[dict[str, Any]],
              large_segment_size: int) -> dict[str, Any]:
    """The report's oom `would_fit` (module docstring). record: the
    replay's OomRecord of the failure (its reserved bytes and limits);
    watches: the attribution's alive at the failure (updates merged)."""
    fit = cap.metadata.get("fit") or {}
    unit = _unit(fit, watches)
    out: dict[str, Any] = {}
    if fit.get("search") and unit is not None:
        out.update(name=unit[0], value=unit[1], searched=searched_largest(str(cap.path), fit.get("gpu"), unit[0]))
        return out
    name, value = unit if unit is not None else ("BATCH", None)
    out.update(name=name, value=value, command=_command(cap, fit, name, value, _gpu(cap, fit)))
    limit = record.allowed if record.allowed is not None else record.capacity
    filled = (oom.get("filled_by") or {}).get("categories") or {}
    if value is None or limit is None or not filled:
        return out
    trainable = sum(int(w.get("trainable", 0)) for w in watches)
    # the state the watched optimizers would make by the textbook's rule, where none exists yet
    later = 0 if filled.get("optimizer_state") else sum(
        int(round(((w.get("optimizer") or {}).get("state_per_parameter") or 0) * int(w.get("trainable", 0))))
        for w in watches)
    rounded = int(oom["request"].get("rounded") or oom["request"]["size"])
    needed = int(record.reserved) + allocation_size(rounded, large_segment_size)
    fixed = sum(int(filled.get(c, 0)) for c in _FIXED) + min(int(filled.get("gradient", 0)), trainable)
    largest = estimate_largest(value, needed, fixed, later, int(limit))
    if largest is not None and largest < value:
        out.update(estimate=largest, needed_bytes=needed, fixed_bytes=fixed, later_bytes=later, limit_bytes=int(limit))
    return out
