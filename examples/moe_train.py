"""One training step of a Hugging Face mixture-of-experts model, built from its config (nothing downloaded).

    python examples/moe_train.py                       # Mixtral-style, 2 layers at full width, bf16, AdamW
    python examples/moe_train.py --family qwen2_moe --layers 2 --hidden 1024
    allocscope run --gpu H100-80GB -- python examples/moe_train.py

How much memory an MoE layer takes depends on where its router sends the tokens, so the script prints, as its
last line, one JSON object: the tokens each expert received per layer (counted from the router's top-k picks),
and torch's peak allocated and reserved bytes.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def build(family: str, layers: int, hidden: int, intermediate: int, experts: int, top_k: int, vocab: int):
    import transformers

    if family == "mixtral":
        config = transformers.MixtralConfig(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
            num_attention_heads=max(1, hidden // 128), num_key_value_heads=max(1, hidden // 512),
            num_local_experts=experts, num_experts_per_tok=top_k, max_position_embeddings=4096)
        return transformers.MixtralForCausalLM(config)
    if family == "qwen2_moe":
        config = transformers.Qwen2MoeConfig(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
            moe_intermediate_size=intermediate, shared_expert_intermediate_size=intermediate,
            num_hidden_layers=layers, num_attention_heads=max(1, hidden // 128),
            num_key_value_heads=max(1, hidden // 512), num_experts=experts, num_experts_per_tok=top_k,
            max_position_embeddings=4096)
        return transformers.Qwen2MoeForCausalLM(config)
    raise SystemExit(f"moe_train.py: unknown family {family!r} (mixtral, qwen2_moe)")


def count_routing(model: torch.nn.Module, experts: int) -> list[list[int]]:
    """Hooks every router (a module whose output holds the top-k expert indices) and returns the list each
    forward appends its per-expert token counts to, one list per router call."""
    counts: list[list[int]] = []

    def hook(_module, _args, output):
        indices = output[-1] if isinstance(output, tuple) else None
        if not isinstance(indices, torch.Tensor) or indices.dtype not in (torch.int64, torch.int32):
            return
        counts.append(torch.bincount(indices.reshape(-1).cpu(), minlength=experts).tolist())

    for name, module in model.named_modules():
        if name.endswith("mlp.gate") or type(module).__name__.endswith("TopKRouter"):
            module.register_forward_hook(hook)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="mixtral", choices=["mixtral", "qwen2_moe"])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=14336)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--experts-implementation", default=None,
                        help="transformers' experts kernel (eager, grouped_mm, batched_mm); its default if unset")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    t0 = time.time()
    torch.manual_seed(args.seed)
    # built on the CPU from the seed, then moved: the same weights on every device
    model = build(args.family, args.layers, args.hidden, args.intermediate, args.experts, args.top_k, args.vocab)
    if args.experts_implementation:
        model.set_experts_implementation(args.experts_implementation)
    model = model.to(dtype=getattr(torch, args.dtype)).to(args.device)
    counts = count_routing(model, args.experts)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    input_ids = torch.randint(0, args.vocab, (args.batch_size, args.seq_len))
    input_ids = input_ids.to(args.device)

    loss = model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    result = {
        "family": args.family, "layers": args.layers, "hidden": args.hidden, "experts": args.experts,
        "top_k": args.top_k, "tokens": args.batch_size * args.seq_len, "dtype": args.dtype,
        "experts_implementation": getattr(model.config, "_experts_implementation", None),
        "tokens_per_expert": counts,
        "loss": float(loss.detach().float().cpu()),
        "seconds": round(time.time() - t0, 2),
    }
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
        result["max_allocated"] = torch.cuda.max_memory_allocated()
        result["max_reserved"] = torch.cuda.max_memory_reserved()
        result["device_name"] = torch.cuda.get_device_name()
    result["torch"] = torch.__version__
    print(json.dumps(result))


if __name__ == "__main__":
    main()
