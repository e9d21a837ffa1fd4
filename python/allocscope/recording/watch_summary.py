"""What a WATCH event says of a watched model and its optimizer
(docs/format.md): what the textbook estimate and the reports need of them,
read once when the watch begins (attribution/estimate.py)."""

from __future__ import annotations

from typing import Any, Callable

from .module_scopes import storage

__all__ = ["check_optimizer", "kv_cache_shape", "model_summary", "optimizer_summary",
           "optimizer_state_per_parameter"]


def optimizer_state_per_parameter(optimizer: Any) -> float | None:
    """How many parameter-sized tensors the textbook says this optimizer
    keeps per parameter (theory.md §3), or None for optimizers it does not
    cover."""
    kind = type(optimizer).__name__
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    if kind == "SGD":
        return 1.0 if group.get("momentum", 0) else 0.0
    if kind in ("Adam", "AdamW"):
        return 3.0 if group.get("amsgrad", False) else 2.0
    if kind in ("Adamax", "NAdam", "RAdam", "Adadelta"):
        return 2.0
    if kind == "Adagrad":
        return 1.0
    if kind == "RMSprop":
        return 1.0 + bool(group.get("momentum", 0)) + bool(group.get("centered", False))
    return None


def check_optimizer(optimizer: Any) -> None:
    import torch

    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, not {type(optimizer).__name__}")


def optimizer_summary(optimizer: Any) -> dict[str, Any]:
    """The WATCH event's `optimizer`: what the textbook estimate needs of it."""
    return {"type": type(optimizer).__name__, "state_per_parameter": optimizer_state_per_parameter(optimizer)}


def kv_cache_shape(model: Any) -> dict[str, int] | None:
    """What one token of the model's KV cache takes, by the textbook formula
    (2 x layers x key/value heads x head dim x bytes per element), where
    the model carries a Hugging Face-style config (None otherwise, and for
    attention the formula does not describe: latent (MLA) caches); on one
    rank of a tensor-parallel engine, its shard of the heads."""
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", None)
    try:
        config = text() if callable(text) else config
        layers = int(getattr(config, "num_hidden_layers"))
        heads = int(getattr(config, "num_attention_heads"))
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or getattr(config, "hidden_size") // heads)
    except Exception:  # a config of another kind: a label, never a reason to break the script
        return None
    if getattr(config, "kv_lora_rank", None):
        return None
    # A tensor-parallel engine keeps a shard of the key/value heads on each
    # rank; vLLM's attention layers say how many (num_kv_heads, at least 1).
    local = next((m.num_kv_heads for m in model.modules()
                  if type(m).__name__.endswith("Attention") and type(getattr(m, "num_kv_heads", None)) is int), None)
    if local is not None and 0 < local < kv_heads:
        kv_heads = local
    element = next((p.element_size() for p in model.parameters() if p.is_floating_point()), None)
    if element is None or min(layers, kv_heads, head_dim) <= 0:
        return None
    return {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "bytes_per_element": element,
            "bytes_per_token": 2 * layers * kv_heads * head_dim * element}


def model_summary(model: Any, qualify: Callable[[str], str]) -> dict[str, Any]:
    """The WATCH event's fields of the model: its name, parameter and
    buffer bytes (shared storage once), and each module's class (so that
    reports can say "Sequential.5 (Conv2d)"), under the names qualify(fqn)
    gives."""
    seen: set[int] = set()
    total = trainable = buffers = count = 0
    for p in model.parameters():
        s = storage(p)
        count += p.numel()
        if s is None or s[0] in seen:
            continue
        seen.add(s[0])
        total += s[1]
        trainable += s[1] if p.requires_grad else 0
    for b in model.buffers():
        s = storage(b)
        if s is not None and s[0] not in seen:
            seen.add(s[0])
            buffers += s[1]
    classes = {qualify(fqn): type(m).__name__ for fqn, m in model.named_modules()}
    return {"name": qualify(""), "parameters": total, "trainable": trainable, "buffers": buffers,
            "parameter_count": count, "classes": classes, "kv_cache": kv_cache_shape(model)}
