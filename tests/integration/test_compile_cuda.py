"""torch.compile with its GPU backend, Inductor: on the virtual GPU Triton
compiles real kernels (ptxas on the CPU), loads them into the stand-in
driver and launches them as no-ops; what Inductor allocates reaches the
caching allocator as on a card. A compiled training step records, replays
exactly and peaks where torch says; with mode="reduce-overhead" the CUDA
graphs' private pools are recorded and replayed too. Marked `cuda`."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import allocscope
from allocscope import vgpu
from allocscope.allocator.recorded import recorded_reserved
from allocscope.attribution import attribute, moment
from allocscope.reports.report import find_mark

from ..replay import assert_exact
from .test_watch_compile import Net

pytestmark = [pytest.mark.cuda, pytest.mark.filterwarnings("ignore::UserWarning")]


def _train(path, mode):
    """Three watched Adam steps of a compiled Net, recorded; torch's own
    peak of reserved memory over them."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net().cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    compiled = torch.compile(model, mode=mode)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with allocscope.record(path, device="cuda") as rec:
        rec.watch(model, opt)
        for step in range(3):
            loss = compiled(torch.randn(256, 128, device="cuda")).square().mean()
            allocscope.mark(f"forward {step}")
            loss.backward()
            opt.step()
            opt.zero_grad()
    return torch.cuda.max_memory_reserved(), model


def _in_compiled_region(cap, op_id: int) -> bool:
    return op_id != 0 and any("Compiled" in f.function for f in cap.stack(op_id))


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_a_compiled_training_step_records_and_replays_exactly(tmp_path, mode):
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    peak, model = _train(tmp_path / "c.alsc", mode)
    cap = allocscope.load(tmp_path / "c.alsc")
    assert cap.complete
    rep = assert_exact(cap)
    assert int(recorded_reserved(cap).max()) == peak == rep.peak_reserved
    att = attribute(cap)
    at = moment(att, find_mark(cap, "forward 2"))
    assert at.by_category["parameter"] == sum(p.numel() * p.element_size() for p in model.parameters())
    # Allocations made inside the compiled region (forward and backward)
    # name it as their op, and a line: Inductor's generated code (its
    # wrapper's `call`) in the forward.
    rows = np.flatnonzero(att.start >= 0)
    inside = [r for r in rows.tolist() if _in_compiled_region(cap, int(att.op[r]))]
    assert inside
    for r in inside:
        frames = cap.stack(int(att.stack[r]))
        assert frames and all(f.line > 0 for f in frames)
    generated = {f.filename for r in inside for f in cap.stack(int(att.stack[r]))
                 if f.filename.startswith(cache_dir())}
    assert any(name.endswith(".py") for name in generated)
    if mode == "reduce-overhead":
        # The graphs were captured into a private pool (CUDA graph trees'),
        # whose segments the recording holds and the replay made exactly.
        assert any(s["pool"] != [0, 0] for s in cap.baseline("end")["segments"])


@pytest.mark.skipif(not vgpu.active(), reason="checks the virtual GPU itself: it launches kernels without their "
                    "arguments, which only the stand-in driver may take")
def test_triton_kernels_are_answered_from_their_cubin_as_cuobjdump_reads_it(tmp_path):
    """What the stand-in driver says of a Triton kernel (registers, stack
    frame, static shared memory) is what NVIDIA's cuobjdump reads from the
    same cubin: Triton and Inductor decide spills and block sizes from it."""
    import ctypes
    import re

    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(cuobjdump):
        pytest.skip("this Triton ships no cuobjdump")

    @triton.jit
    def matmul(a, b, c, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            acc += tl.dot(tl.load(a + rm[:, None] * K + (k + rk)[None, :]), tl.load(b + (k + rk)[:, None] * BN + rn))
        tl.store(c + rm[:, None] * BN + rn[None, :], acc)

    signature = {"a": "*fp16", "b": "*fp16", "c": "*fp32", "K": "i32", "BM": "constexpr", "BN": "constexpr",
                 "BK": "constexpr"}
    driver = ctypes.CDLL("libcuda.so.1")
    driver.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    torch.cuda.init()

    def launch(function, threads, shared):
        return driver.cuLaunchKernel(function, 1, 1, 1, threads, 1, 1, shared, None, None, None)
    for blocks in ((32, 32, 32), (128, 128, 64), (256, 128, 64)):  # small; spilling; more shared memory
        kernel = triton.compile(ASTSource(matmul, signature=signature,
                                          constexprs=dict(zip(("BM", "BN", "BK"), blocks, strict=True))),
                                target=GPUTarget("cuda", 90, 32))
        cubin = kernel.asm["cubin"]
        (tmp_path / "k.cubin").write_bytes(cubin)
        out = subprocess.run([cuobjdump, "-res-usage", str(tmp_path / "k.cubin")], capture_output=True, text=True,
                             check=True).stdout
        usage = {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED):(\d+)", out)}
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        assert driver.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(cubin)) == 0
        assert driver.cuModuleGetFunction(ctypes.byref(function), module, kernel.metadata.name.encode()) == 0
        assert driver.cuModuleGetFunction(ctypes.byref(ctypes.c_void_p()), module, b"no_such_kernel") != 0

        def attribute_of(number, function=function):
            value = ctypes.c_int()
            assert driver.cuFuncGetAttribute(ctypes.byref(value), number, function) == 0
            return value.value

        # CU_FUNC_ATTRIBUTE_NUM_REGS 4, LOCAL_SIZE_BYTES 3, SHARED_SIZE_BYTES 1, MAX_THREADS_PER_BLOCK 0
        assert (attribute_of(4), attribute_of(3), attribute_of(1)) == (usage["REG"], usage["STACK"],
                                                                        usage["SHARED"]), blocks
        threads = attribute_of(0)
        assert kernel.metadata.num_warps * 32 <= threads <= 1024
        assert threads <= 65536 // (((usage["REG"] * 32 + 255) // 256) * 256) * 32
        # A launch the card would refuse is refused: too many threads for the
        # kernel's registers, more dynamic shared memory than it opted into.
        # Without opting in, 48 KiB whatever the kernel's 1 KiB section (Triton
        # launches such kernels of 48 KiB on an H100: vLLM's fused MoE kernel).
        dynamic = attribute_of(8)  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        assert dynamic == 48 * 1024
        assert launch(function, threads, dynamic) == 0
        assert launch(function, threads + 32, 0) == 701  # CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
        assert launch(function, threads, dynamic + 1) == 1  # CUDA_ERROR_INVALID_VALUE
        # Opting in: an attribute newer than CUDA 13.0 is refused (Triton's
        # "oversized" shared memory mode, 17), the maximum is taken up to the
        # card's opt-in limit less the kernel's section, and launches to it.
        assert driver.cuFuncSetAttribute(function, 17, 3) == 1
        optin = ctypes.c_int()
        assert driver.cuDeviceGetAttribute(ctypes.byref(optin), 97, 0) == 0  # ..._PER_BLOCK_OPTIN
        assert driver.cuFuncSetAttribute(function, 8, optin.value - usage["SHARED"] + 1) == 1
        assert driver.cuFuncSetAttribute(function, 8, optin.value - usage["SHARED"]) == 0
        assert launch(function, threads, optin.value - usage["SHARED"]) == 0
        assert launch(function, threads, optin.value - usage["SHARED"] + 1) == 1
        driver.cuModuleUnload(module)


def test_a_compiled_model_runs_under_allocscope_run_with_the_default_backend(tmp_path):
    """What a user runs: their script, unmodified, on the virtual GPU."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)).cuda()\n"
        "step = torch.compile(lambda x: m(x).sum())\n"
        "step(torch.randn(32, 64, device='cuda')).backward()\n"
        "print('ok')\n")
    result = subprocess.run([sys.executable, "-m", "allocscope", "run", "--gpu", "H100-80GB",
                             "-o", str(tmp_path / "t.alsc"), "--", sys.executable, str(script)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ok" in result.stdout
    cap = allocscope.load(tmp_path / "t.alsc")
    assert cap.complete
    assert_exact(cap)
