"""What a selection over uncomputed values picks (docs/vgpu.md, "Values").

A top-k, argmax or multinomial draw over values that no kernel computed (a router's logits after an uncomputed
matmul, a language model's next-token scores) has no answer of its own; on the virtual GPU it picks by a
documented choice instead, and these functions make it. Over a short dimension (at most ROUTING_MAX_WIDTH
entries: experts) the choice is the routing the user chose; over a longer one (a vocabulary) it is the middle of
the dimension, which no tokenizer's end-of-sequence or padding token sits at (they sit at either end), so that
generation runs to max_new_tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["COMPUTE_MODES", "ENV_COMPUTE", "ENV_ROUTING", "ROUTINGS", "ROUTING_MAX_WIDTH", "Routing", "expert_counts",
           "parse_mode", "parse_routing", "select"]

ENV_COMPUTE = "ALLOCSCOPE_VGPU_COMPUTE"  # values (default), all, none
ENV_ROUTING = "ALLOCSCOPE_VGPU_ROUTING"  # balanced (default), balanced:FACTOR, worst, computed
# widest dimension treated as a choice among experts
ROUTING_MAX_WIDTH = 4096
ROUTINGS = ("balanced", "worst", "computed")
# what the virtual GPU computes: the ops that steer shapes (values), every op it can (all), none
COMPUTE_MODES = ("values", "all", "none")


def parse_mode(text: str) -> str:
    if text not in COMPUTE_MODES:
        raise ValueError(f"compute {text!r}: one of values (the default), all, none")
    return text


@dataclass(frozen=True)
class Routing:
    """kind: balanced (each expert gets rows × k / E picks, ±1), worst (every row picks experts 0..k-1) or
    computed (the selection runs on whatever the values are: zeros or stale bytes). imbalance: with balanced,
    the busiest expert (expert 0) gets this many times the mean, the others share the rest evenly."""

    kind: str = "balanced"
    imbalance: float = 1.0

    def __str__(self) -> str:
        if self.kind == "balanced" and self.imbalance != 1.0:
            return f"balanced:{self.imbalance:g}"
        return self.kind


def parse_routing(text: str) -> Routing:
    """"balanced", "balanced:1.5" (the busiest expert gets 1.5 times the mean), "worst", "computed"."""
    kind, _, factor = text.strip().partition(":")
    if kind not in ROUTINGS:
        raise ValueError(f"routing {text!r}: one of balanced, balanced:FACTOR, worst, computed")
    if factor and kind != "balanced":
        raise ValueError(f"routing {text!r}: only balanced takes a factor (balanced:1.5)")
    try:
        imbalance = float(factor) if factor else 1.0
    except ValueError:
        raise ValueError(f"routing {text!r}: the factor must be a number (balanced:1.5)") from None
    if not imbalance >= 1.0:
        raise ValueError(f"routing {text!r}: the factor is at least 1 (the busiest expert against the mean)")
    return Routing(kind, imbalance)


def expert_counts(picks: int, experts: int, k: int, imbalance: float) -> list[int]:
    """How many of `picks` (rows × k) each expert gets: the busiest (expert 0) round(imbalance × mean), capped
    at one pick per row, the others the rest, evenly (±1)."""
    rows = picks // k
    busiest = min(rows, max(0, round(imbalance * picks / experts)))
    if imbalance == 1.0 or experts == 1:
        return [picks // experts + (1 if e < picks % experts else 0) for e in range(experts)]
    rest = picks - busiest
    others = experts - 1
    counts = [busiest] + [rest // others + (1 if e < rest % others else 0) for e in range(others)]
    return counts


def select(shape: tuple[int, ...], k: int, routing: Routing) -> "torch.Tensor":
    """The indices (int64, shape[:-1] + (k,), on the CPU) a top-k over the last dimension of uncomputed values
    of `shape` returns."""
    import torch

    width = shape[-1]
    rows = 1
    for n in shape[:-1]:
        rows *= n
    if width > ROUTING_MAX_WIDTH:
        middle = width // 2
        out = torch.arange(middle, middle + k, dtype=torch.int64).clamp_(max=width - 1).repeat(rows, 1)
    elif routing.kind == "worst":
        out = torch.arange(k, dtype=torch.int64).repeat(rows, 1)
    else:
        # Experts in the order of their counts, laid out column by column: pick j of row r is entry j × rows
        # + r, so a row never meets the same expert twice while no expert has more picks than there are rows.
        counts = expert_counts(rows * k, width, k, routing.imbalance)
        tickets = torch.repeat_interleave(torch.arange(width, dtype=torch.int64), torch.tensor(counts))
        out = tickets.view(k, rows).t().contiguous() if rows else tickets.view(0, k)
    return out.view(*shape[:-1], k)
