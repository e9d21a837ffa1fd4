"""Do C++ and Python exceptions reach Python intact, on every thread torch uses?

    python benchmarks/probe_exceptions.py            # on the CUDA device torch sees (a card, or a virtual one)

Prints one JSON line: for each case, the exception type and first line that
reached Python. On the virtual GPU of the H100 machine (torch 2.11, Python
3.12) an OutOfMemoryError raised inside backward arrived as torch's
"e_ptr INTERNAL ASSERT FAILED ... translate_exception_to_python called with
invalid exception pointer", and so did checkpointing's own internal stop
(gpu_check_h100_torch2.11_r23.json); this machine (Python 3.11) does not show
it. The cases separate the main thread, the autograd engine's device thread
(Python and C++ errors), the CPU engine and a plain Python thread, so that one
run on the GPU machine says where exceptions break.
"""

from __future__ import annotations

import json
import os
import sys
import threading

import torch


class _RaisesInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise ValueError("raised in backward")


class _OutOfMemoryInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):  # more than any card has: c10 raises OutOfMemoryError
        return torch.empty(1 << 50, dtype=torch.uint8, device=grad.device)[:1].float()


def _outcome(fn) -> str:
    try:
        fn()
        return "no error"
    except Exception as e:  # the point is which exception arrives
        return f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("probe_exceptions: no CUDA device here (run it on a GPU, or under allocscope run --gpu H100-80GB)")
    dev = "cuda"

    def engine_python_error():
        _RaisesInBackward.apply(torch.ones(4, device=dev, requires_grad=True)).sum().backward()

    def engine_cpp_error():  # c10 raises: the hook changes the gradient's size
        y = torch.ones(4, device=dev, requires_grad=True) * 3
        y.register_hook(lambda g: torch.ones(5, device=dev))
        y.sum().backward()

    def engine_oom():  # c10::OutOfMemoryError from the device thread
        _OutOfMemoryInBackward.apply(torch.ones(1, device=dev, requires_grad=True)).sum().backward()

    def cpu_engine_python_error():
        _RaisesInBackward.apply(torch.ones(4, requires_grad=True)).sum().backward()

    results = {
        "main thread, c10 error": _outcome(lambda: torch.ones(2, device=dev).view(3)),
        "main thread, out of memory": _outcome(lambda: torch.empty(1 << 50, dtype=torch.uint8, device=dev)),
        "device thread, Python error": _outcome(engine_python_error),
        "device thread, c10 error": _outcome(engine_cpp_error),
        "device thread, out of memory": _outcome(engine_oom),
        "CPU engine, Python error": _outcome(cpu_engine_python_error),
    }
    box: list[str] = []
    t = threading.Thread(target=lambda: box.append(_outcome(lambda: torch.ones(2, device=dev).view(3))))
    t.start()
    t.join()
    results["Python thread, c10 error"] = box[0]
    print(json.dumps({"python": sys.version.split()[0], "torch": torch.__version__,
                      "device": torch.cuda.get_device_name(0), "cases": results, "libraries": _runtime_libraries()}))


def _runtime_libraries() -> list[str]:
    """The C++ runtimes and CUDA libraries loaded, by path: two copies of a
    C++ runtime (or a driver library beside the stand-in) would explain
    exceptions that arrive without their pointer."""
    import re

    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "/" in line}
    wanted = re.compile(r"lib(stdc\+\+|gcc_s|c\.so|cuda|cudart|cublas|nvidia-ml|vgpu|nvrtc|cudnn)")
    return sorted(p for p in paths if wanted.search(os.path.basename(p)))


if __name__ == "__main__":
    main()
