"""The CUDA runtime torch loaded, for tests that call it directly
(cudaMalloc outside the allocator, cudaMemset, managed memory)."""

from __future__ import annotations

import ctypes
import os


def cudart() -> ctypes.CDLL:
    """The virtual GPU's stand-in libcudart where it is active, else the
    card's, as this process mapped it."""
    from allocscope import vgpu

    if vgpu.active():
        (name,) = [n for n in os.listdir(vgpu.LIB_DIR) if n.startswith("libcudart.so.")]
        return ctypes.CDLL(os.path.join(vgpu.LIB_DIR, name))
    with open("/proc/self/maps") as f:
        (path, *_) = {line.split()[-1] for line in f if "/libcudart.so." in line}
    return ctypes.CDLL(path)
