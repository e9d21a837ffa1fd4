"""vLLM offline generation, as its docs write it (`LLM(...)`, `generate`), on a
Llama-style (or, with --experts, a Qwen2-MoE) model made from its config
with dummy weights (nothing downloaded; token ids in, no tokenizer).

    python examples/vllm_generate.py --max-model-len 2048 --requests 4
    allocscope fit --gpu L4-24GB -- python examples/vllm_generate.py

Prints, as its last line, one JSON object: the KV cache vLLM sized (its
number of GPU blocks and block size) and the tokens generated. (The memory
is the engine core's, a child process by default: its own capture.)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile


def model_folder(args: argparse.Namespace) -> str:
    """A folder with a config.json (Llama, or with --experts a Qwen2-MoE):
    what vLLM reads of a model besides its weights."""
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": args.hidden,
        "intermediate_size": args.intermediate, "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads, "vocab_size": args.vocab,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
    }
    if args.experts:
        config.update({
            "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_experts": args.experts,
            "num_experts_per_tok": args.experts_per_token, "moe_intermediate_size": args.moe_intermediate,
            "shared_expert_intermediate_size": args.intermediate, "decoder_sparse_step": 1,
            "norm_topk_prob": False, "mlp_only_layers": [], "rope_theta": 1000000.0,
        })
    name = "-".join(str(config[k]) for k in ("model_type", "num_hidden_layers", "hidden_size",
                                               "num_key_value_heads", "vocab_size")) + f"-{args.experts}"
    folder = os.path.join(tempfile.gettempdir(), f"allocscope-vllm-{name}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return folder


def model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model's shape and the engine's settings (examples/vllm_serve.py takes the same)."""
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--experts", type=int, default=0, help="a Qwen2-MoE model of this many experts a layer")
    parser.add_argument("--experts-per-token", type=int, default=4)
    parser.add_argument("--moe-intermediate", type=int, default=1408)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--kv-cache-memory", type=int, default=None, help="bytes (vLLM's kv_cache_memory_bytes)")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--disable-custom-all-reduce", action="store_true")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(parser)
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    options = {"kv_cache_memory_bytes": args.kv_cache_memory} if args.kv_cache_memory else {}
    llm = LLM(model=model_folder(args), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
              gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=args.enforce_eager,
              tensor_parallel_size=args.tensor_parallel_size,
              disable_custom_all_reduce=args.disable_custom_all_reduce, **options)
    prompts = [{"prompt_token_ids": [(7 * i + j) % (args.vocab - 3) + 3 for j in range(args.prompt_len)]}
               for i in range(args.requests)]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, detokenize=False))
    cache = llm.llm_engine.vllm_config.cache_config
    print(json.dumps({
        "num_gpu_blocks": cache.num_gpu_blocks, "block_size": cache.block_size,
        "generated_tokens": [len(o.outputs[0].token_ids) for o in outputs],
    }))


if __name__ == "__main__":
    main()
