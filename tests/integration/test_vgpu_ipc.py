"""CUDA IPC on the virtual GPU: a process exports an allocation
(cudaIpcGetMemHandle) and another opens it (cudaIpcOpenMemHandle), as
vLLM's custom all-reduce shares its buffers between tensor-parallel
workers. The importer maps it on the exporter's card without charging it
again; a process cannot open its own handle; closing unmaps. (Two
processes on two virtual H100s, whatever card the suite runs on.)"""

import json
import os
import subprocess
import sys

import pytest

import allocscope

pytestmark = pytest.mark.skipif(not allocscope.vgpu.available(), reason="built without the virtual GPU")

COMMON = """
import ctypes, json, os, sys
import torch
torch.cuda.init()
lib = os.environ["LIB"]
rt = ctypes.CDLL(os.path.join(lib, next(n for n in os.listdir(lib) if n.startswith("libcudart.so."))))
class Handle(ctypes.Structure):  # cudaIpcMemHandle_t, passed by value
    _fields_ = [("reserved", ctypes.c_char * 64)]
"""
EXPORT = COMMON + """
x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda:0")
handle = Handle()
assert rt.cudaIpcGetMemHandle(ctypes.byref(handle), ctypes.c_void_p(x.data_ptr())) == 0
own = rt.cudaIpcOpenMemHandle(ctypes.byref(ctypes.c_void_p()), handle, 1)
print(json.dumps({"handle": bytes(handle).hex(), "own": own}), flush=True)
sys.stdin.read()  # (the allocation lives until the test is done)
"""
OPEN = COMMON + """
handle = Handle.from_buffer_copy(bytes.fromhex(sys.argv[1]))
free0, _ = torch.cuda.mem_get_info(1)
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


def test_another_process_opens_an_exported_allocation_on_the_exporters_card():
    env = allocscope.vgpu.environment("2xH100-80GB") | {"LIB": allocscope.vgpu.LIB_DIR}
    exporter = subprocess.Popen([sys.executable, "-c", EXPORT], env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = exporter.stdout.readline()
        assert line, exporter.stderr.read()[-3000:]
        exported = json.loads(line)
        assert exported["own"] != 0  # a process cannot open its own handle
        p = subprocess.run([sys.executable, "-c", OPEN, exported["handle"]], env=env, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
    finally:
        exporter.communicate("", timeout=60)
    got = json.loads(p.stdout.strip().splitlines()[-1])
    # device memory on card 0 (cudaMemoryTypeDevice = 2), charged to no one in the importer
    assert got == {"status": 0, "type": 2, "device": 0, "charged": 0, "closed": 0, "again": 1}
    assert exporter.returncode == 0
