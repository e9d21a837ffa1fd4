"""What every benchmark report carries, and how it is printed."""

import json
import os
import platform
import sys


def environment() -> dict:
    import torch

    return {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
    }


def emit(report: dict, out: str | None) -> None:
    """Prints the report as JSON, and writes it to `out` too if given."""
    text = json.dumps(report, indent=2)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
