"""The virtual driver as a CUDA runtime of its own asks for it (NVIDIA's
static runtime, in CuTe DSL's library that FlashInfer's kernels load):
through cuGetProcAddress, the entry point cuGetProcAddress itself in both
of its forms (a runtime that does not find it takes the driver for one too
old to use) and a stream's context."""

import ctypes
import os

import pytest
import torch

import allocscope

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif("not __import__('allocscope').vgpu.active()", reason="the virtual GPU's driver")]


@pytest.fixture
def driver():
    torch.cuda.init()
    return ctypes.CDLL(os.path.join(allocscope.vgpu.LIB_DIR, "libcuda.so.1"))


def entry(driver, name, version=12000):
    pfn, status = ctypes.c_void_p(), ctypes.c_int(-1)
    assert driver.cuGetProcAddress_v2(name.encode(), ctypes.byref(pfn), version, ctypes.c_uint64(0),
                                      ctypes.byref(status)) == 0
    return pfn.value, status.value


def test_the_driver_gives_itself_and_an_unknown_name_is_not_found(driver):
    own, status = entry(driver, "cuGetProcAddress")
    assert own is not None and status == 0
    # (called through the pointer it gave: the same table)
    proc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                            ctypes.c_uint64, ctypes.POINTER(ctypes.c_int))(own)
    pfn, status = ctypes.c_void_p(), ctypes.c_int(-1)
    assert proc(b"cuInit", ctypes.byref(pfn), 12000, 0, ctypes.byref(status)) == 0 and pfn.value and status.value == 0
    assert entry(driver, "cuNoSuchEntryPoint") == (None, 1)  # CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND


def test_asked_for_itself_as_of_cuda_11_it_gives_the_form_without_a_status(driver):
    # (a CUDA runtime asks at 11.3 and at 12.0, and calls the first with four
    # arguments: the five-argument form would write the status through
    # whatever the fifth register holds)
    old, status = entry(driver, "cuGetProcAddress", 11030)
    assert status == 0
    assert old == ctypes.cast(driver.cuGetProcAddress, ctypes.c_void_p).value
    assert old != entry(driver, "cuGetProcAddress", 12000)[0] == ctypes.cast(driver.cuGetProcAddress_v2,
                                                                              ctypes.c_void_p).value


def test_a_stream_belongs_to_its_devices_primary_context(driver):
    stream = torch.cuda.Stream()
    context, current = ctypes.c_void_p(), ctypes.c_void_p()
    assert driver.cuStreamGetCtx(ctypes.c_void_p(stream.cuda_stream), ctypes.byref(context)) == 0
    assert driver.cuCtxGetCurrent(ctypes.byref(current)) == 0
    assert context.value is not None and context.value == current.value
    assert driver.cuStreamGetCtx(ctypes.c_void_p(0), ctypes.byref(context)) == 0  # the default stream
    assert context.value == current.value
