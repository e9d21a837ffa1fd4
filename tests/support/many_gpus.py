"""What the tests of several virtual cards share: their markers (CUDA on the
virtual GPU, with its NCCL) and running the allocscope command line."""

import os
import subprocess
import sys

import pytest

import allocscope

MARKS = [
    pytest.mark.cuda,
    pytest.mark.many_gpus,
    pytest.mark.skipif(not allocscope.vgpu.available(), reason="built without the virtual GPU"),
    pytest.mark.skipif(not os.path.exists(os.path.join(allocscope.vgpu.LIB_DIR, "libnccl.so.2")),
                       reason="built without nccl.h: the virtual GPU has no NCCL"),
]


def allocscope_cli(cwd, *args, check=True):
    """`allocscope ARGS` in cwd; its exit status 0 unless check is False."""
    r = subprocess.run([sys.executable, "-m", "allocscope", *args], capture_output=True, text=True, timeout=300,
                       cwd=cwd)
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r
