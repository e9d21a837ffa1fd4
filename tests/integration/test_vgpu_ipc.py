"""CUDA IPC on the virtual GPU: a process exports an allocation
(cudaIpcGetMemHandle) and another opens it (cudaIpcOpenMemHandle), as
vLLM's custom all-reduce shares its buffers between tensor-parallel
workers. The importer maps it on the exporter's card without charging it
again; a process cannot open its own handle; closing unmaps."""

import ctypes
import os
import subprocess
import sys

import pytest
import torch

import allocscope

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif("not __import__('allocscope').vgpu.active()", reason="the virtual GPU's runtime")]

OPEN = """
import ctypes, json, os, sys
import torch
torch.cuda.init()
rt = ctypes.CDLL(os.path.join(sys.argv[1], [n for n in os.listdir(sys.argv[1]) if n.startswith("libcudart.so.")][0]))
class Handle(ctypes.Structure):  # cudaIpcMemHandle_t, passed by value
    _fields_ = [("reserved", ctypes.c_char * 64)]
handle = Handle.from_buffer_copy(bytes.fromhex(sys.argv[2]))
free0, total = torch.cuda.mem_get_info(1)
ptr = ctypes.c_void_p()
status = rt.cudaIpcOpenMemHandle(ctypes.byref(ptr), handle, 1)
attrs = (ctypes.c_int * 8)()  # cudaPointerAttributes: type, device, ...
rt.cudaPointerGetAttributes(attrs, ptr)
free1, _ = torch.cuda.mem_get_info(1)
closed = rt.cudaIpcCloseMemHandle(ptr)
again = rt.cudaIpcCloseMemHandle(ptr)
print(json.dumps({"status": status, "type": attrs[0], "device": attrs[1], "charged": free0 - free1,
                  "closed": closed, "again": again}))
"""


class Handle(ctypes.Structure):  # cudaIpcMemHandle_t, passed by value
    _fields_ = [("reserved", ctypes.c_char * 64)]


def runtime():
    name = next(n for n in os.listdir(allocscope.vgpu.LIB_DIR) if n.startswith("libcudart.so."))
    return ctypes.CDLL(os.path.join(allocscope.vgpu.LIB_DIR, name))


def test_another_process_opens_an_exported_allocation_on_the_exporters_card(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two virtual cards (pytest --vgpu 2xH100-80GB)")
    rt = runtime()
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda:0")
    handle = Handle()
    assert rt.cudaIpcGetMemHandle(ctypes.byref(handle), ctypes.c_void_p(x.data_ptr())) == 0
    # this process cannot open its own
    assert rt.cudaIpcOpenMemHandle(ctypes.byref(ctypes.c_void_p()), handle, 1) != 0
    env = allocscope.vgpu.environment(os.environ[allocscope.vgpu.ENV_GPU])
    p = subprocess.run([sys.executable, "-c", OPEN, allocscope.vgpu.LIB_DIR, bytes(handle).hex()], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = __import__("json").loads(p.stdout.strip().splitlines()[-1])
    # device memory on card 0 (cudaMemoryTypeDevice = 2), charged to no one in the importer
    assert got == {"status": 0, "type": 2, "device": 0, "charged": 0, "closed": 0, "again": 1}
