"""SGLang offline generation, as its docs write it (`sgl.Engine(...)`,
`generate`), on a Llama-style model made from its config with dummy
weights (examples/vllm_generate.py's; nothing downloaded; token ids in,
no tokenizer).

    python examples/sglang_generate.py --max-model-len 2048 --requests 4
    allocscope fit --gpu L4-24GB -- python examples/sglang_generate.py

Prints, as its last line, one JSON object: the KV cache SGLang sized (its
max_total_num_tokens) and the tokens generated. (The memory is the
scheduler's, a process of its own: its own capture.)
"""

from __future__ import annotations

import argparse
import json

from vllm_generate import model_arguments, model_folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(parser)
    parser.add_argument("--mem-fraction-static", type=float, default=None)
    parser.add_argument("--cuda-graph-max-bs", type=int, default=None)
    args = parser.parse_args()

    import sglang as sgl

    options = {k: v for k, v in (("mem_fraction_static", args.mem_fraction_static),
                                 ("cuda_graph_max_bs", args.cuda_graph_max_bs)) if v is not None}
    llm = sgl.Engine(model_path=model_folder(args), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
                     context_length=args.max_model_len, max_running_requests=args.max_num_seqs,
                     disable_cuda_graph=args.enforce_eager, tp_size=args.tensor_parallel_size, **options)
    prompts = [[(7 * i + j) % (args.vocab - 3) + 3 for j in range(args.prompt_len)] for i in range(args.requests)]
    outputs = llm.generate(input_ids=prompts, sampling_params={"max_new_tokens": args.max_tokens, "ignore_eos": True})
    info = llm.get_server_info()
    llm.shutdown()
    print(json.dumps({
        "max_total_num_tokens": info.get("max_total_num_tokens"),
        "generated_tokens": [len(o["output_ids"]) for o in outputs],
    }))


if __name__ == "__main__":
    main()
