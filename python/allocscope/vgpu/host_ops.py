"""How an op that has no CPU kernel of the same meaning is computed on the host (values.py).

Each substitute takes the op's arguments and its CUDA outputs, all as host tensors over the same bytes (the
aliases values.py makes), and writes the outputs it can. torch's CUDA-only attention kernels are computed with
the math attention (the same values, up to rounding); their auxiliary outputs (log-sum-exp, random state) are
not written (the backward substitutes recompute what they need), but count as computed, so that the backward
runs.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["SUBSTITUTES", "substitute"]


def _bound(overload: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    out = {}
    for i, a in enumerate(overload._schema.arguments):
        if i < len(args):
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        else:
            out[a.name] = a.default_value if a.has_default_value() else None
    return out


def _probabilities(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None, causal: bool,
                   scale: float | None) -> torch.Tensor:
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q.double() @ k.double().transpose(-2, -1)) * scale
    if bias is not None:
        scores = scores + bias.double()
    if causal:
        L, S = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L).logical_not(),
                                    float("-inf"))
    return torch.softmax(scores, dim=-1)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, causal: bool,
               scale: float | None) -> torch.Tensor:
    return (_probabilities(q, k, bias, causal, scale) @ v.double()).to(q.dtype)


def _attention_grads(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     bias: torch.Tensor | None, causal: bool, scale: float | None) -> tuple[torch.Tensor, ...]:
    # by hand: these kernels run below autograd, where no graph is recorded
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    p = _probabilities(q, k, bias, causal, scale)
    d_out = grad_out.double()
    d_v = p.transpose(-2, -1) @ d_out
    d_p = d_out @ v.double().transpose(-2, -1)
    d_s = p * (d_p - (d_p * p).sum(dim=-1, keepdim=True))
    d_q = (d_s @ k.double()) * scale
    d_k = (d_s.transpose(-2, -1) @ q.double()) * scale
    return d_q, d_k, d_v


def _write_grad(out: torch.Tensor, grad: torch.Tensor) -> None:
    # a broadcast input (one key/value head for several query heads) gets the sum over what it served
    dims = [i for i, (o, g) in enumerate(zip(out.shape, grad.shape, strict=True)) if o == 1 and g != 1]
    out.copy_(grad.sum(dim=dims, keepdim=True) if dims else grad)


def _efficient_forward(overload: Any, args: tuple, kwargs: dict, outputs: list) -> None:
    b = _bound(overload, args, kwargs)
    outputs[0].copy_(_attention(b["query"], b["key"], b["value"], b["attn_bias"], bool(b["is_causal"]),
                                b.get("scale")))


def _efficient_backward(overload: Any, args: tuple, kwargs: dict, outputs: list) -> None:
    b = _bound(overload, args, kwargs)
    grads = _attention_grads(b["grad_out_"], b["query"], b["key"], b["value"], b["attn_bias"],
                             bool(b["is_causal"]), b.get("scale"))
    for out, g in zip(outputs[:3], grads, strict=False):
        if out.numel():
            _write_grad(out, g)


def _flash_forward(overload: Any, args: tuple, kwargs: dict, outputs: list) -> None:
    b = _bound(overload, args, kwargs)
    outputs[0].copy_(_attention(b["query"], b["key"], b["value"], None, bool(b["is_causal"]), b.get("scale")))


def _flash_backward(overload: Any, args: tuple, kwargs: dict, outputs: list) -> None:
    b = _bound(overload, args, kwargs)
    grads = _attention_grads(b["grad_out"], b["query"], b["key"], b["value"], None, bool(b["is_causal"]),
                             b.get("scale"))
    for out, g in zip(outputs[:3], grads, strict=False):
        _write_grad(out, g)


def _histc(overload: Any, args: tuple, kwargs: dict, outputs: list) -> None:
    # CUDA counts integers too; the CPU kernel takes floating point only
    b = _bound(overload, args, kwargs)
    counts = torch.histc(b["self"].double(), bins=b["bins"], min=b["min"], max=b["max"])
    outputs[0].copy_(counts)


# op overload -> what computes it on the host: f(overload, host args, host kwargs, host outputs)
SUBSTITUTES: dict[str, Callable[[Any, tuple, dict, list], None]] = {
    "_scaled_dot_product_efficient_attention.default": _efficient_forward,
    "_scaled_dot_product_efficient_attention_backward.default": _efficient_backward,
    "_scaled_dot_product_flash_attention.default": _flash_forward,
    "_scaled_dot_product_flash_attention_backward.default": _flash_backward,
    "histc.default": _histc,
}

def substitute(name: str) -> Callable[[Any, tuple, dict, list], None] | None:
    return SUBSTITUTES.get(name)
