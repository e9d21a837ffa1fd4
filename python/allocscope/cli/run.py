"""allocscope run: record a whole command without touching it."""

from __future__ import annotations

import argparse
import glob
import os
import signal
import subprocess
import sys

NAME = "run"
HELP = "record a command (a Python script, torchrun, ...) into a capture file"
DESCRIPTION = """\
Run a command with recording on. Every Python process it starts that uses
torch records into the capture file: from the moment torch is imported (CPU)
or CUDA is initialized (CUDA) until the process exits. A second process of the
same run writes FILE with its rank (torchrun) or pid added to the name.

examples:
  allocscope run -o step.alsc -- python train.py --epochs 1
  allocscope run -o step.alsc -- train.py --epochs 1        (python is implied)
  allocscope run -o ddp.alsc --device cuda -- torchrun --nproc-per-node 2 train.py
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="capture file to write")
    parser.add_argument("-f", "--force", action="store_true", help="overwrite FILE if it exists")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="what to record: CUDA memory, CPU memory, or auto (CUDA if available, else CPU)")
    parser.add_argument("--stacks", choices=("python", "none"), default="python",
                        help="record each allocation's Python stack (default) or not")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="the command to run, after --")


def _command(args: argparse.Namespace) -> list[str]:
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ValueError("no command given: allocscope run -o FILE -- python script.py")
    if cmd[0].endswith(".py") or cmd[0] == "-m":
        cmd = [sys.executable, *cmd]
    return cmd


def _device(choice: str) -> str:
    if choice != "auto":
        return choice
    try:
        import torch
    except ImportError:
        raise ValueError("torch cannot be imported here; allocscope run needs it") from None
    return "cuda" if torch.cuda.is_available() else "cpu"


def _outputs(path: str) -> list[str]:
    stem, ext = os.path.splitext(path)
    found = [path] if os.path.exists(path) else []
    return found + sorted(glob.glob(f"{glob.escape(stem)}.rank*{ext}") + glob.glob(f"{glob.escape(stem)}.pid*{ext}"))


def run(args: argparse.Namespace) -> int:
    from .. import _autostart

    cmd = _command(args)
    output = os.path.abspath(args.output)
    if _outputs(output):
        if not args.force:
            raise ValueError(f"{args.output} exists; use --force to overwrite it")
        for old in _outputs(output):
            os.remove(old)
    device = _device(args.device)
    env = _autostart.child_environment(os.environ, output, {"device": device, "stacks": args.stacks})
    try:
        child = subprocess.Popen(cmd, env=env)
    except OSError as e:
        raise ValueError(f"cannot run {cmd[0]}: {e.strerror}") from None
    # The terminal sends Ctrl-C to the child too; let it finish its capture.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    forward = lambda signum, frame: child.send_signal(signum)  # noqa: E731
    previous_term = signal.signal(signal.SIGTERM, forward)
    try:
        status = child.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)
    written = _outputs(output)
    if written:
        for path in written:
            print(f"allocscope: wrote {os.path.relpath(path)}", file=sys.stderr)
    else:
        print(f"allocscope: no capture was written (did the command use torch{' on CUDA' if device == 'cuda' else ''}?)",
              file=sys.stderr)
    return status if status >= 0 else 128 - status
