"""allocscope run: record a whole command without touching it."""

from __future__ import annotations

import argparse
import os
import sys

from .options import (add_limit_arguments, add_values_arguments, add_world_arguments, limits_from, values_from,
                      world_from)

NAME = "run"
HELP = "record a command (a Python script, torchrun, ...) into a capture file, on a GPU or a virtual one"
DESCRIPTION = """\
Run a command with recording on. Every Python process it starts that uses
torch records into the capture file: from the moment torch is imported (CPU)
or CUDA is initialized (CUDA) until the process exits. A second process of the
same run writes FILE with its rank (torchrun) or pid added to the name.

With --gpu, the command runs on a virtual GPU of that model instead of
whatever GPU this machine has (or has not): torch's real CUDA caching
allocator runs, kernels compute nothing but the cheap ops whose values steer
shapes and control flow, so memory behaves as on the card (docs/vgpu.md,
"Values"). `--gpu list` lists the models.

The script's models and optimizers are watched (named, so that the report
says what each byte is: parameters, gradients, optimizer state,
activations, by module), each model from its first call and each optimizer
from its first step, as `fit` does. That costs a Python call on every
module call of the process and the op callback (torch's RecordFunction) on
every op from the first model call on (docs/benchmarks.md, "What watching
costs"); --no-watch records allocations and their stacks alone, at the
lowest cost, and the report then says where, not what.

examples:
  allocscope run -o step.alsc -- python train.py --epochs 1
  allocscope run -o step.alsc -- train.py --epochs 1        (python is implied)
  allocscope run --no-watch -o step.alsc -- python train.py (stacks only: the lowest cost)
  allocscope run -o ddp.alsc --device cuda -- torchrun --nproc-per-node 2 train.py
  allocscope run --gpu H100-80GB -o h100.alsc -- python train.py
  allocscope run --gpu A100-40GB --gpu-memory 12GiB -o small.alsc -- python train.py
  allocscope run --gpu H100-80GB-MIG-1g.10gb -o slice.alsc -- python train.py
  allocscope run --gpu A100-40GB --no-record -- python train.py
  allocscope run --gpu 2xH100-80GB -o ddp.alsc -- torchrun --nproc-per-node 2 train.py
  allocscope run --gpu H100-80GB --world-size 1024 --rank 0 --rank 7 -o job.alsc -- python train.py
  allocscope run --gpu list

With --world-size, each rank given (--rank, default 0) runs alone, as that
rank of a job of that many processes (torchrun's environment, backend nccl
without peers), on its own virtual node of --gpus-per-node cards; its capture
is FILE with .rankN added. `allocscope report FILE` reports across the ranks.
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", metavar="FILE", help="capture file to write (not with --no-record)")
    parser.add_argument("-f", "--force", action="store_true", help="overwrite FILE if it exists")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="what to record: CUDA memory, CPU memory, or auto (CUDA if available, else CPU)")
    parser.add_argument("--stacks", choices=("python", "none"), default="python",
                        help="record each allocation's Python stack (default) or not")
    watch = parser.add_mutually_exclusive_group()
    watch.add_argument("--watch", action="store_const", const=True, dest="watch",
                       help="watch the script's models and optimizers (the default, as `fit` does): each model "
                            "when first called, each optimizer at its first step; categories and modules in the "
                            "report. It costs a Python call per module call and turns ops on")
    watch.add_argument("--no-watch", action="store_const", const=False, dest="watch",
                       help="record allocations and their stacks alone, at the lowest cost: no categories or "
                            "modules beyond what a script's own allocscope.watch() calls name")
    ops = parser.add_mutually_exclusive_group()
    ops.add_argument("--ops", action="store_const", const=True, dest="ops",
                     help="record the op behind every allocation from the start (default: from the first "
                          "allocscope.watch() on; a callback on every op, which costs where the CPU is the bottleneck)")
    ops.add_argument("--no-ops", action="store_const", const=False, dest="ops", help="never record ops")
    parser.add_argument("--gpu", metavar="GPU",
                        help="run on a virtual GPU: a model (H100-80GB), a MIG slice (H100-80GB-MIG-1g.10gb), "
                             "N of them (2xA100-40GB), several (H100-80GB,L4-24GB), one with its own memory "
                             "(H100-80GB:20GiB), or `list` to list the models")
    parser.add_argument("--gpu-memory", metavar="SIZE", help="the virtual GPU's total memory (e.g. 12GiB)")
    parser.add_argument("--no-record", action="store_true", help="run on the virtual GPU without recording")
    add_values_arguments(parser)
    add_limit_arguments(parser)
    add_world_arguments(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="the command to run, after --")


def _list_gpus() -> int:
    from .. import vgpu
    from ..common.units import format_bytes

    presets = vgpu.presets()
    kw, nw = max(len(p.key) for p in presets), max(len(p.name) for p in presets)
    print(f"{'GPU':<{kw}}  {'name':<{nw}}  {'memory':>11}  {'capability':>10}  {'SMs':>4}")
    for p in presets:
        print(f"{p.key:<{kw}}  {p.name:<{nw}}  {format_bytes(p.total_memory):>11}  {p.major}.{p.minor:<8}  "
              f"{p.multi_processor_count:>4}")
    print("\nA card's own memory: GPU:SIZE (H100-80GB:20GiB); several cards: 2xH100-80GB, H100-80GB,A100-40GB.")
    return 0


def run(args: argparse.Namespace) -> int:
    from ..common.errors import InputError
    from ..harness.run import run_command

    if args.gpu == "list":
        return _list_gpus()
    if args.gpu_memory and not args.gpu:
        raise InputError("--gpu-memory sets the virtual GPU's memory: give --gpu too")
    if args.no_record and not args.gpu:
        raise InputError("--no-record runs on the virtual GPU: give --gpu too (without it, run the command itself)")
    if args.no_record and args.output:
        raise InputError("--no-record writes no capture: leave out -o")
    if args.no_record and (args.watch is not None or args.ops is not None):
        raise InputError("--watch, --no-watch, --ops and --no-ops are about what a recording holds: "
                         "not with --no-record")
    if not args.no_record and not args.output:
        raise InputError("give the capture file: allocscope run -o FILE -- python script.py")
    result = run_command(args.command, None if args.no_record else args.output, gpu=args.gpu,
                         gpu_memory=args.gpu_memory, device=args.device, stacks=args.stacks, force=args.force,
                         world=world_from(args), ops=args.ops, watch=args.watch is not False, values=values_from(args),
                         limits=limits_from(args))
    for path in result.captures:
        print(f"allocscope: wrote {os.path.relpath(path)}", file=sys.stderr)
    if result.device and not result.captures:
        on = " on CUDA" if result.device == "cuda" else ""
        print(f"allocscope: no capture was written (did the command use torch{on}?)", file=sys.stderr)
    return result.status
