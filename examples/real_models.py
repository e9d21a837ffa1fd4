"""Train a real model architecture for a few steps, with random weights and
random data (nothing is downloaded): GPT-2 small, a Llama-style 1.1B decoder,
BERT-base, ResNet-50, ConvNeXt-T or a diffusion-style UNet (examples/model_zoo.py). Made to be run on a virtual
GPU, to learn whether a run fits a card and with what batch size:

    allocscope fit --gpu A100-40GB --gpu L4-24GB -- python examples/real_models.py gpt2 --batch-size 8
    allocscope fit --gpu L4-24GB --search BATCH=1..64 -- python examples/real_models.py gpt2 --batch-size {BATCH}
    allocscope run --gpu H100-80GB -o llama.alsc -- python examples/real_models.py llama --amp bf16 --checkpoint

With transformers / torchvision installed (optional), --impl auto builds
their models from configurations; otherwise plain-PyTorch equivalents with
the same layer shapes and parameter counts.

--compile: torch.compile with its default backend, inductor, on a GPU and on
the virtual GPU alike (Triton's kernels compile on the CPU and launch as
no-ops there: docs/vgpu.md); on the CPU, or with --compile-backend aot_eager,
AOTAutograd with eager kernels (what backward saves as under inductor, but
not inductor's fusion).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_zoo  # noqa: E402

try:
    from allocscope import mark, watch
except ImportError:  # the script runs without allocscope too
    def mark(label: str) -> bool:
        return False

    def watch(model, optimizer=None, **kwargs):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=model_zoo.MODELS)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="per micro-batch (default: 8; Llama 1, ResNet-50 and ConvNeXt 32)")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default: the model's context)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--accumulate", type=int, default=1, metavar="N", help="micro-batches per optimizer step")
    parser.add_argument("--amp", choices=("bf16", "fp16"), help="torch.autocast to this dtype")
    parser.add_argument("--checkpoint", action="store_true", help="activation checkpointing per block")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--compile-backend", default=None,
                        help="default: inductor on a GPU (virtual or not), aot_eager on the CPU")
    parser.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    parser.add_argument("--impl", choices=("auto", "hf", "plain"), default="auto",
                        help="hf: transformers / torchvision; plain: the equivalents in model_zoo.py")
    parser.add_argument("--no-cudnn", action="store_true", help="torch.backends.cudnn.enabled = False")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", action="store_true", help="print the peaks as JSON at the end")
    args = parser.parse_args()
    if args.impl == "hf" and not model_zoo.installed("hf", args.model):
        parser.error(f"--impl hf needs {'torchvision' if args.model in model_zoo.CONV_MODELS else 'transformers'}"
                     if args.model != "unet" else "--impl hf: the UNet has no transformers / torchvision version")
    if min(args.steps, args.accumulate, args.batch_size or 1, args.seq or 1) < 1:
        parser.error("--steps, --accumulate, --batch-size and --seq must be at least 1")

    torch.manual_seed(0)
    if args.no_cudnn:
        torch.backends.cudnn.enabled = False
    device = torch.device(args.device)
    batch = args.batch_size or model_zoo.default_batch(args.model)
    with device:  # weights made where they live: no host copy (on the virtual GPU, no host memory)
        model, make_batch, loss_fn = model_zoo.build(args.model, args.impl, seq=args.seq,
                                                     checkpointing=args.checkpoint)
    model.train()
    if args.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    watch(model, opt)  # under allocscope run / fit: parameters, gradients, activations, optimizer state named
    if args.compile:
        backend = args.compile_backend or ("inductor" if device.type == "cuda" else "aot_eager")
        model = torch.compile(model, backend=backend)
    started = time.perf_counter()
    model_zoo.train_steps(model, opt, make_batch, loss_fn, batch=batch, steps=args.steps, device=device,
                          accumulate=args.accumulate, amp=args.amp, after_step=lambda step: mark(f"step {step}"))
    seconds = time.perf_counter() - started
    out = {"model": args.model, "impl": args.impl if args.impl != "auto" else
           ("hf" if model_zoo.installed("hf", args.model) else "plain"),
           "parameters": model_zoo.parameters(model), "batch": batch, "steps": args.steps, "seconds": seconds,
           "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
    if device.type == "cuda":
        out |= {"max_memory_reserved": torch.cuda.max_memory_reserved(device),
                "max_memory_allocated": torch.cuda.max_memory_allocated(device)}
    print(json.dumps(out) if args.json else
          f"{args.model} ({out['parameters']:,} parameters, batch {batch}): {args.steps} steps in {seconds:.2f} s"
          + (f", peak reserved {out['max_memory_reserved'] / 2**30:.2f} GiB" if device.type == "cuda" else ""))


if __name__ == "__main__":
    main()
