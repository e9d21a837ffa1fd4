"""allocscope simulate: replay a CUDA capture through a model of the caching
allocator, with the recorded settings (fidelity) or others (what-if)."""

from __future__ import annotations

import argparse
import json

from ..common.units import parse_bytes
from .options import add_capture, add_json, load_capture

NAME = "simulate"
HELP = "replay a CUDA capture through the caching allocator with other settings or a smaller GPU"
DESCRIPTION = """\
Replay every allocation, free and empty_cache() of a CUDA capture through a
model of PyTorch's caching allocator (docs/allocator.md). With the recorded
settings, the replay must reproduce the recorded segment events (cudaMalloc,
cudaFree, expandable map/unmap) exactly: this checks the model on your run.
With --config (any PYTORCH_CUDA_ALLOC_CONF string, as set for a fresh run:
what it leaves out takes torch's defaults) and/or --limit (the total
memory of a smaller GPU; memory outside PyTorch measured when recording still
counts), it predicts the peak reserved memory, the fragmentation at the peak,
and whether and where the run would have run out of memory. --suggest tries
the settings that matter and ranks them (runs that fit first, then by peak
reserved). The same requests are replayed in the same order: a run whose
allocations depend on how much memory is free (e.g. cuDNN autotuning) may
behave differently for real.

examples:
  allocscope simulate train.alsc
  allocscope simulate train.alsc --config expandable_segments:True
  allocscope simulate train.alsc --limit 24GiB --suggest
  allocscope simulate train.alsc --suggest --json | jq '.suggestions[0]'
"""

def prepare_parser(parser: argparse.ArgumentParser) -> None:
    add_capture(parser, help="capture file (recorded on CUDA)")
    parser.add_argument("--config", metavar="SETTINGS",
                        help="allocator settings to try, as in PYTORCH_CUDA_ALLOC_CONF (e.g. expandable_segments:True)")
    parser.add_argument("--limit", metavar="SIZE", help="total memory of the GPU to simulate (e.g. 24GiB, 80GB)")
    parser.add_argument("--suggest", action="store_true", help="try the settings that matter and rank them")
    add_json(parser)


def run(args: argparse.Namespace) -> int:
    from ..allocator.config import parse_alloc_conf
    from ..common.errors import InputError
    from ..reports.simulate import render, simulate

    limit = parse_bytes(args.limit) if args.limit else None
    if limit is not None and limit <= 0:
        raise InputError("--limit must be positive")
    cap = load_capture(args.file)
    # As PYTORCH_CUDA_ALLOC_CONF for a fresh run: what the string leaves out takes torch's defaults.
    config = parse_alloc_conf(args.config) if args.config is not None else None
    out = simulate(cap, config=config, limit=limit, suggestions=args.suggest)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(render(out))
    return 0
