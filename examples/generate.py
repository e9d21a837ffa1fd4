"""Hugging Face generate() on a Llama-style model built from its config (nothing downloaded).

    python examples/generate.py --max-new-tokens 32
    python examples/generate.py --cache static --do-sample
    allocscope run --gpu L4-24GB -- python examples/generate.py

Prints, as its last line, one JSON object: how many forward passes (one prefill, then one per decoding step) and
new tokens generation took, and torch's peak allocated and reserved bytes.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--cache", default="dynamic", choices=["dynamic", "static"])
    parser.add_argument("--do-sample", action="store_true")
    parser.add_argument("--num-beams", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import transformers

    t0 = time.time()
    torch.manual_seed(args.seed)
    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.prompt_len + args.max_new_tokens + 64)
    model = transformers.LlamaForCausalLM(config).to(dtype=getattr(torch, args.dtype)).to(args.device).eval()
    forwards = []
    model.register_forward_hook(lambda _m, args_, kwargs, _out: forwards.append(1), with_kwargs=True)
    prompt = torch.randint(0, args.vocab, (args.batch_size, args.prompt_len)).to(args.device)
    kwargs = {"cache_implementation": "static"} if args.cache == "static" else {}
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.max_new_tokens,
                             do_sample=args.do_sample, num_beams=args.num_beams, pad_token_id=0, **kwargs)
    result = {
        "layers": args.layers, "hidden": args.hidden, "kv_heads": args.kv_heads,
        "head_dim": args.hidden // args.heads, "batch_size": args.batch_size, "prompt_len": args.prompt_len,
        "max_new_tokens": args.max_new_tokens, "cache": args.cache, "do_sample": args.do_sample,
        "num_beams": args.num_beams, "dtype": args.dtype,
        "forward_passes": len(forwards), "new_tokens": out.shape[1] - args.prompt_len,
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
