"""The op behind an allocation, as the reports name it.

A recorded op chain (docs/format.md, the op column) runs from the op the
Python code called to the one that allocated: `aten::linear` >
`aten::addmm`, or in backward the autograd node and its ops:
`AddmmBackward0` > `aten::mm`. Reports group by a short name: the outer op,
and the inner one where it says more (not when it is a plain allocation op
such as `aten::empty_strided`, which every op ends in). A backward
allocation's Python stack is that of the forward op that made its node, so
its site reads `model.py:47 (forward) [backward: ConvolutionBackward0]`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = ["OpName", "op_names", "NO_OP"]

NO_OP = "<no op>"
AUTOGRAD_FILE = "<autograd>"
# Ops that only make or convert storage: named only when nothing else is.
_PLAIN = frozenset({"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
                    "aten::new_empty_strided", "aten::resize_", "aten::to", "aten::_to_copy", "aten::copy_",
                    "aten::contiguous", "aten::clone"})


@dataclasses.dataclass(frozen=True)
class OpName:
    name: str  # the short name reports group by
    chain: tuple[str, ...]  # outermost first
    backward_node: str | None  # the autograd node it ran in, if any


def _short(chain: tuple[str, ...]) -> str:
    if not chain:
        return NO_OP
    outer = chain[0]
    inner = next((c for c in reversed(chain[1:]) if c not in _PLAIN), None)
    return outer if inner is None or inner == outer else f"{outer} > {inner}"


def op_names(cap: Any, ops: np.ndarray) -> dict[int, OpName]:
    """{op id: OpName} for the distinct op ids in `ops` (0: no op)."""
    out: dict[int, OpName] = {}
    for op in np.unique(ops).tolist():
        frames = cap.stack(int(op)) if op else []
        chain = tuple(f.function for f in reversed(frames))
        node = next((f.function for f in reversed(frames) if f.filename == AUTOGRAD_FILE), None)
        out[int(op)] = OpName(_short(chain), chain, node)
    return out
