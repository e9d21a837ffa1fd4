"""The virtual GPU's NVML as serving engines read it before CUDA starts
(vLLM's platform detection, through pynvml): the same card CUDA shows."""

import ctypes
import os

import pytest
import torch

import allocscope

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif("not __import__('allocscope').vgpu.active()", reason="the virtual GPU's NVML")]


class PciInfo(ctypes.Structure):  # nvmlPciInfo_t (nvml.h; pynvml's layout)
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


@pytest.fixture
def nvml():
    lib = ctypes.CDLL(os.path.join(allocscope.vgpu.LIB_DIR, "libnvidia-ml.so.1"))
    assert lib.nvmlInit_v2() == 0
    return lib


def handle(nvml, index=0):
    h = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(h)) == 0
    return h


def test_nvml_names_the_card_cuda_shows(nvml):
    h = handle(nvml)
    major, minor = ctypes.c_int(), ctypes.c_int()
    assert nvml.nvmlDeviceGetCudaComputeCapability(h, ctypes.byref(major), ctypes.byref(minor)) == 0
    assert (major.value, minor.value) == torch.cuda.get_device_capability(0)
    index = ctypes.c_uint(99)
    assert nvml.nvmlDeviceGetIndex(h, ctypes.byref(index)) == 0 and index.value == 0
    uuid = ctypes.create_string_buffer(96)
    assert nvml.nvmlDeviceGetUUID(h, uuid, 96) == 0
    again = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByUUID(uuid.value, ctypes.byref(again)) == 0 and again.value == h.value
    assert nvml.nvmlDeviceGetHandleByUUID(b"GPU-not-a-card", ctypes.byref(again)) == 6  # NVML_ERROR_NOT_FOUND


def test_pci_numa_and_affinity_place_the_card_on_this_host(nvml):
    h = handle(nvml)
    pci = PciInfo()
    assert nvml.nvmlDeviceGetPciInfo_v3(h, ctypes.byref(pci)) == 0
    by_bus = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByPciBusId_v2(pci.busId, ctypes.byref(by_bus)) == 0 and by_bus.value == h.value
    node = ctypes.c_uint(7)
    assert nvml.nvmlDeviceGetNumaNodeId(h, ctypes.byref(node)) == 0 and node.value == 0
    words = (os.cpu_count() + 63) // 64 + 1
    cpus = (ctypes.c_ulong * words)()
    assert nvml.nvmlDeviceGetCpuAffinity(h, words, cpus) == 0
    assert sum(bin(w).count("1") for w in cpus) == os.cpu_count()


def test_no_card_is_its_own_peer(nvml):
    h = handle(nvml)
    status = ctypes.c_int(-1)
    assert nvml.nvmlDeviceGetP2PStatus(h, h, 0, ctypes.byref(status)) == 0 and status.value == 5  # NOT_SUPPORTED
