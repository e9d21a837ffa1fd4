"""The virtual GPU's stand-in libraries provide every function the installed
torch imports from the CUDA libraries they stand in for, under the same
SONAMEs and symbol versions. Read from the installed torch's own dynamic
symbol tables (as test_header_audit.py reads its headers), not from a list,
so that a torch upgrade that imports something new fails here."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from allocscope import vgpu

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.skipif(torch.version.cuda is None, reason="needs a CUDA build of torch"),
    pytest.mark.skipif(shutil.which("nm") is None or shutil.which("readelf") is None, reason="needs binutils"),
    pytest.mark.skipif(not vgpu.available(), reason="allocscope was built without the virtual GPU"),
]

MAJOR = int((torch.version.cuda or "0").split(".")[0])
TORCH_LIBS = sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "*.so*")))
# Imports without a version that name driver functions (libcaffe2_nvrtc links
# libcuda.so.1); cuFile* is libcufile's.
DRIVER = re.compile(r"^cu(?!File)[A-Z]\w*$")


def _symbols(path: str, *flags: str) -> list[tuple[str, str | None]]:
    out = subprocess.run(["nm", "-D", "--with-symbol-versions", *flags, path], capture_output=True, text=True,
                         check=True).stdout
    result = []
    for line in out.splitlines():
        name = line.split()[-1]
        base, _, version = name.replace("@@", "@").partition("@")
        result.append((base, version or None))
    return result


def _imports() -> dict[str, set[str]]:
    """{library the import names (its version node, or libcuda.so.1): names}."""
    by_lib: dict[str, set[str]] = {}
    for path in TORCH_LIBS:
        for name, version in _symbols(path, "--undefined-only"):
            if version and (version.startswith("libcu") or version.startswith("libnvidia")):
                by_lib.setdefault(version, set()).add(name)
            elif version is None and DRIVER.match(name):
                by_lib.setdefault("libcuda.so.1", set()).add(name)
    return by_lib


def _defined(lib: str) -> set[tuple[str, str | None]]:
    return set(_symbols(os.path.join(vgpu.LIB_DIR, lib), "--defined-only"))


def _strings(path: str, pattern: str) -> set[str]:
    with open(path, "rb") as f:
        data = f.read()
    # whole NUL-terminated strings (lookarounds: neighbours share their NULs)
    return {m.decode() for m in re.findall(rb"(?<=\x00)(" + pattern.encode() + rb")(?=\x00)", data)}


@pytest.mark.parametrize("lib", [f"libcudart.so.{MAJOR}", f"libcublas.so.{MAJOR}", f"libcublasLt.so.{MAJOR}"])
def test_every_versioned_import_of_torch_is_defined_with_its_version(lib):
    wanted = _imports().get(lib)
    assert wanted, f"torch imports nothing from {lib}: is this the CUDA {MAJOR} build it claims to be?"
    missing = {(name, lib) for name in wanted} - _defined(lib)
    assert not missing, f"{lib} stand-in lacks {sorted(n for n, _ in missing)}"


def test_every_driver_function_torch_links_is_defined():
    wanted = _imports().get("libcuda.so.1", set())
    assert "cuLaunchKernel" in wanted  # libcaffe2_nvrtc's imports were read
    missing = wanted - {name for name, _ in _defined("libcuda.so.1")}
    assert not missing, f"libcuda.so.1 stand-in lacks {sorted(missing)}"


def test_every_driver_entry_point_c10_asks_for_is_handed_out():
    # c10 names the driver functions it wants as strings, and fetches them
    # through cudaGetDriverEntryPointByVersion: ask the stand-in for each (in
    # a child process: loading a libcuda.so.1 here would reach torch's CUDA).
    c10_cuda = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10_cuda.so")
    names = sorted(_strings(c10_cuda, r"cu[A-Z][A-Za-z0-9_]+"))
    assert "cuMemCreate" in names and "cuMemMap" in names
    code = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); f = lib.vgpu_driver_entry_point; "
            "f.restype = ctypes.c_void_p; f.argtypes = [ctypes.c_char_p]; "
            "print(' '.join(n for n in sys.argv[2:] if not f(n.encode())))")
    out = subprocess.run([sys.executable, "-c", code, os.path.join(vgpu.LIB_DIR, "libcuda.so.1"), *names],
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == [], "not handed out by cudaGetDriverEntryPointByVersion"


def test_every_nvml_function_c10_opens_is_defined():
    c10_cuda = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10_cuda.so")
    names = _strings(c10_cuda, r"nvml[A-Z][A-Za-z0-9_]+")
    assert "nvmlDeviceGetComputeRunningProcesses" in names
    missing = names - {name for name, _ in _defined("libnvidia-ml.so.1")}
    assert not missing, f"libnvidia-ml.so.1 stand-in lacks {sorted(missing)}"


def test_sonames_match_the_libraries_torch_links():
    needed = set()
    for path in TORCH_LIBS:
        dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
        needed |= set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic))
    for lib in (f"libcudart.so.{MAJOR}", f"libcublas.so.{MAJOR}", f"libcublasLt.so.{MAJOR}"):
        assert lib in needed
    for lib in (f"libcudart.so.{MAJOR}", f"libcublas.so.{MAJOR}", f"libcublasLt.so.{MAJOR}", "libcuda.so.1",
                "libnvidia-ml.so.1"):
        dynamic = subprocess.run(["readelf", "-d", os.path.join(vgpu.LIB_DIR, lib)], capture_output=True, text=True,
                                 check=True).stdout
        assert re.search(rf"\(SONAME\)\s+Library soname: \[{re.escape(lib)}\]", dynamic), lib


ERROR_NAMES = r"""
import ctypes, json, os, sys
lib = sys.argv[1]
cuda = ctypes.CDLL(os.path.join(lib, "libcuda.so.1"))
cudart = ctypes.CDLL(os.path.join(lib, os.path.basename(sys.argv[2])))
cudart.cudaGetErrorName.restype = cudart.cudaGetErrorString.restype = ctypes.c_char_p
out = {"driver": {}, "runtime": {}}
for code in json.loads(sys.argv[3]):
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    cuda.cuGetErrorName(code, ctypes.byref(name))
    cuda.cuGetErrorString(code, ctypes.byref(text))
    out["driver"][code] = [name.value.decode(), text.value.decode()]
for code in json.loads(sys.argv[4]):
    out["runtime"][code] = [cudart.cudaGetErrorName(code).decode(), cudart.cudaGetErrorString(code).decode()]
print(json.dumps(out))
"""


def test_every_error_the_stand_ins_return_has_its_name_and_message():
    # The codes the stand-ins return (driver.cpp to_cu, cudart_common.h), as cuda.h and driver_types.h number them.
    driver = {0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
              101: "CUDA_ERROR_INVALID_DEVICE", 400: "CUDA_ERROR_INVALID_HANDLE", 600: "CUDA_ERROR_NOT_READY",
              100: "CUDA_ERROR_NO_DEVICE", 801: "CUDA_ERROR_NOT_SUPPORTED",
              900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", 401: "CUDA_ERROR_ILLEGAL_STATE"}
    runtime = {0: "cudaSuccess", 1: "cudaErrorInvalidValue", 2: "cudaErrorMemoryAllocation",
               101: "cudaErrorInvalidDevice", 400: "cudaErrorInvalidResourceHandle", 600: "cudaErrorNotReady",
               100: "cudaErrorNoDevice", 801: "cudaErrorNotSupported", 900: "cudaErrorStreamCaptureUnsupported",
               401: "cudaErrorIllegalState"}
    cudart = glob.glob(os.path.join(vgpu.LIB_DIR, "libcudart.so.*"))[0]
    out = subprocess.run([sys.executable, "-c", ERROR_NAMES, vgpu.LIB_DIR, cudart, json.dumps(list(driver)),
                          json.dumps(list(runtime))], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    for table, expected in (("driver", driver), ("runtime", runtime)):
        for code, name in expected.items():
            got_name, text = got[table][str(code)]
            assert got_name == name, (table, code, got_name)
            assert text and (code == 0) == (text == "no error") and text != "unknown error", (table, code, text)


def test_every_nccl_function_torch_imports_is_defined_unversioned():
    """torch's libraries import NCCL's functions without a version (libnccl.so.2
    has none); the stand-in must define each one, and nothing else by the
    real library's SONAME."""
    wanted = {name for path in TORCH_LIBS for name, version in _symbols(path, "--undefined-only")
              if version is None and name.startswith("nccl")}
    assert "ncclAllReduce" in wanted  # libtorch_cuda's imports were read
    path = os.path.join(vgpu.LIB_DIR, "libnccl.so.2")
    if not os.path.exists(path):
        pytest.skip("built without nccl.h: the virtual GPU has no NCCL")
    defined = {name for name, version in _defined("libnccl.so.2") if version is None}
    assert not wanted - defined, f"libnccl.so.2 stand-in lacks {sorted(wanted - defined)}"
    soname = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    assert "[libnccl.so.2]" in soname


# What each stand-in may export: its API (names as the real library's), and
# libvgpu.so's core, which the others call (namespace vgpu, mangled _ZN4vgpu).
API = {"libcudart": r"(__)?cuda\w+", "libcuda": r"cu\w+|vgpu_\w+", "libcublas": r"cublas\w+",
       "libcublasLt": r"cublasLt\w+", "libnvidia-ml": r"nvml\w+", "libnccl": r"nccl\w+", "libcudnn": r"cudnn\w+",
       "libvgpu": r"_ZN4vgpu\w+|allocscope_vgpu_\w+"}


# (the libraries themselves: not link/, their linker names for code built at run time)
@pytest.mark.parametrize("lib", sorted(n for n in os.listdir(vgpu.LIB_DIR) if os.path.isfile(os.path.join(vgpu.LIB_DIR, n)))
                         if os.path.isdir(vgpu.LIB_DIR) else [])
def test_stand_ins_export_their_api_and_nothing_else(lib):
    """The stand-ins are loaded globally before torch, so whatever else they
    exported would take the place of torch's own symbols: the weak copies of
    the C++ library's templates and inline functions that every object file
    holds (std::vector's, and with GCC 13's headers exception_ptr's). While
    they did, every C++ exception caught in torch arrived as "e_ptr INTERNAL
    ASSERT FAILED" on the H100 machine's virtual GPU
    (benchmarks/results/gpu_check_h100_torch2.11_s29.json); since they
    export their API alone, all arrive intact on the same image's H200
    machine (gpu_check_h200_torch2.11.json; docs/vgpu.md)."""
    api = re.compile(API[lib.split(".")[0]])
    out = subprocess.run(["nm", "-D", "--defined-only", os.path.join(vgpu.LIB_DIR, lib)], capture_output=True,
                         text=True, check=True).stdout
    rows = [(*line.split()[:-1], line.split()[-1].split("@")[0]) for line in out.splitlines()]
    # (the version node's own symbol is absolute: "A libcudart.so.13")
    extra = sorted(name for *_, kind, name in rows if kind != "A" and not api.fullmatch(name))
    assert not extra, f"{lib} exports more than its API: {extra[:5]}"
    assert any(kind != "A" for *_, kind, _ in rows)
