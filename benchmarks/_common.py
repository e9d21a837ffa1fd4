"""What every benchmark report carries, and how it is printed."""

import json
import os
import platform
import sys


def environment() -> dict:
    import torch

    from allocscope import vgpu

    return {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        # allocscope's virtual GPU (kernels compute nothing): CPU time only
        "virtual_gpu": os.environ.get(vgpu.ENV_GPU) if vgpu.active() else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
    }


def on_virtual_gpu(gpu: str | None) -> None:
    """With --gpu: runs this benchmark again in a child on that virtual GPU
    (it has to be on before torch loads) and exits with its status."""
    import subprocess

    from allocscope import vgpu

    if not gpu or vgpu.active():
        return
    argv = [a for i, a in enumerate(sys.argv) if a != "--gpu" and (i == 0 or sys.argv[i - 1] != "--gpu")]
    argv = [a for a in argv if not a.startswith("--gpu=")]
    sys.exit(subprocess.run([sys.executable, *argv], env=vgpu.environment(gpu)).returncode)


def emit(report: dict, out: str | None) -> None:
    """Prints the report as JSON, and writes it to `out` too if given."""
    text = json.dumps(report, indent=2)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
