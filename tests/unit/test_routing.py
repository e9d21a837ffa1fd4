"""What a selection over uncomputed values picks on the virtual GPU (vgpu/routing.py)."""

import pytest
import torch

from allocscope.vgpu.routing import ROUTING_MAX_WIDTH, Routing, parse_routing, select


def _counts(picked: torch.Tensor, experts: int) -> list[int]:
    return torch.bincount(picked.reshape(-1), minlength=experts).tolist()


@pytest.mark.parametrize("tokens,experts,k", [(2048, 8, 2), (7, 8, 3), (1000, 64, 6), (5, 16, 1), (33, 3, 3)])
def test_balanced_gives_every_expert_tokens_times_k_over_experts_within_one(tokens, experts, k):
    picked = select((tokens, experts), k, Routing())
    assert picked.shape == (tokens, k) and picked.dtype == torch.int64
    mean = tokens * k / experts
    assert all(abs(c - mean) < 1 for c in _counts(picked, experts))
    assert all(len(set(row)) == k for row in picked.tolist())  # a token never picks an expert twice


def test_an_imbalance_factor_gives_the_busiest_expert_that_many_times_the_mean():
    picked = select((2048, 8), 2, Routing("balanced", 2.0))
    counts = _counts(picked, 8)
    assert counts[0] == 1024 and max(counts[1:]) - min(counts[1:]) <= 1 and sum(counts) == 4096
    assert all(len(set(row)) == 2 for row in picked.tolist())
    # no expert can take more than one pick per token: the factor is capped there
    assert _counts(select((100, 8), 2, Routing("balanced", 50.0)), 8)[0] == 100


def test_worst_sends_every_token_to_the_same_experts():
    assert _counts(select((4, 16, 8), 2, Routing("worst")), 8) == [64, 64, 0, 0, 0, 0, 0, 0]


def test_over_a_vocabulary_the_middle_is_picked_whatever_the_routing():
    for routing in (Routing(), Routing("worst")):
        picked = select((3, 50257), 2, routing)
        assert picked.tolist() == [[25128, 25129]] * 3
    assert select((2, ROUTING_MAX_WIDTH), 1, Routing()).max() < ROUTING_MAX_WIDTH  # experts up to the limit


def test_leading_dimensions_are_kept():
    assert select((2, 3, 8), 2, Routing()).shape == (2, 3, 2)
    assert select((0, 8), 2, Routing()).shape == (0, 2)


@pytest.mark.parametrize("text,expected", [("balanced", "balanced"), ("balanced:1.5", "balanced:1.5"),
                                           ("balanced:1", "balanced"), ("worst", "worst"), ("computed", "computed")])
def test_routings_parse_and_print_back(text, expected):
    assert str(parse_routing(text)) == expected


@pytest.mark.parametrize("text", ["random", "worst:2", "balanced:x", "balanced:0.5", ""])
def test_bad_routings_are_one_line_errors(text):
    with pytest.raises(ValueError, match="routing"):
        parse_routing(text)
