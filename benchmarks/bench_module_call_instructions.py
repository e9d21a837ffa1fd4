"""What a module call costs with hooks, in instructions (callgrind); prints JSON.

    python benchmarks/bench_module_call_instructions.py [--calls 1000] [--out FILE]

1000 calls of a leaf module that returns its input, inside a recording
without ops on the CPU: with no hooks, with a forward pre-hook and an
(always-called) forward hook that do nothing (Module._call_impl's slow
path), with hooks of two Python lines around a C call, watched (rec.watch(),
the module a child of the watched root: the process's global hooks look it
up and write its scopes in C, recording/global_hooks.py), watched with the
Python reference of those C functions (Watch.native_module_hooks = False),
and not watched while another model is (the global hooks' cost to every
module call of the process). Needs valgrind's headers and gcc, as
bench_step_instructions.py.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

MODES = ("no_hooks", "empty_hooks", "two_line_hooks", "watched", "watched_python_hooks", "beside_a_watch")


def child(mode: str, calls: int, lib: str) -> None:
    import ctypes

    import torch

    import allocscope

    toggle = ctypes.CDLL(lib)

    class Same(torch.nn.Module):
        def forward(self, x):
            return x

    root = torch.nn.Sequential(*[Same() for _ in range(100)])
    x = torch.zeros(1)
    with tempfile.TemporaryDirectory() as tmp, \
            allocscope.record(os.path.join(tmp, "c.alsc"), device="cpu", ops=False) as rec:
        if mode == "empty_hooks":
            for m in root:
                m.register_forward_pre_hook(lambda m, a: None)
                m.register_forward_hook(lambda m, a, o: None, always_call=True)
        elif mode == "two_line_hooks":
            is_compiling, call = torch.compiler.is_compiling, id

            def pre(m, a):
                if is_compiling():
                    return
                call(m)

            def post(m, a, o):
                if is_compiling():
                    return
                call(m)

            for m in root:
                m.register_forward_pre_hook(pre)
                m.register_forward_hook(post, always_call=True)
        elif mode == "watched":
            rec.watch(root)
        elif mode == "beside_a_watch":
            other = torch.nn.Linear(1, 1)
            rec.watch(other)
        elif mode == "watched_python_hooks":
            from allocscope.recording.watcher import Watch

            Watch.native_module_hooks = False
            rec.watch(root)
        for _ in range(2):
            for m in root:
                m(x)
        toggle.allocscope_bench_start()
        for _ in range(calls // 100):
            for m in root:
                m(x)
        toggle.allocscope_bench_stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--out")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "LIB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.calls, args.child[1])
        return
    from _common import emit, environment
    from bench_step_instructions import _toggle_library, instructions

    per_call = {}
    with tempfile.TemporaryDirectory() as tmp:
        lib = _toggle_library(tmp)
        for mode in MODES:
            out = os.path.join(tmp, f"cg.{mode}")
            subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
                            f"--callgrind-out-file={out}", sys.executable, os.path.abspath(__file__),
                            "--calls", str(args.calls), "--child", mode, lib],
                           check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": "0"})
            per_call[mode] = round(instructions(out) / args.calls)
    emit({"benchmark": "module_call_instructions", **environment(), "calls": args.calls,
          "command": "python benchmarks/bench_module_call_instructions.py " + " ".join(sys.argv[1:]),
          "instructions_per_call": per_call}, args.out)


if __name__ == "__main__":
    main()
