"""The virtual GPU: PyTorch's real CUDA caching allocator on a machine without one.

allocscope builds stand-in CUDA libraries (csrc/vgpu/, installed in
allocscope/vgpu/lib/) that make torch believe a GPU of a chosen model exists.
torch's own c10 caching allocator, the one of the installed torch, then runs
unchanged on top of them: its rounding, pools, segments, caching and
out-of-memory errors are real. Device memory is address space that costs host
memory only where written; kernels compute nothing; copies really copy.

It has to be switched on before torch loads its CUDA libraries:

    allocscope run --gpu H100-80GB -o out.alsc -- python train.py    # a command, recorded
    allocscope run --gpu H100-80GB --no-record -- python train.py    # a command, not recorded
    pytest --vgpu H100-80GB                                          # a test suite (pytest plugin)
    allocscope.vgpu.activate("H100-80GB")                            # this process, before import torch

docs/vgpu.md describes the model, what it is faithful to, and its limits.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import sys
from typing import Any, Mapping

from ..common.errors import InputError
# The tables of cuDNN's workspaces recorded on cards (csrc/vgpu/cudnn_tables.h); default: the ones shipped
from .cudnn import CUDNN_TABLES, ENV_CUDNN_TABLES
from .distributed import ENV_EXCHANGE
from .routing import ENV_COMPUTE, ENV_ROUTING, parse_mode, parse_routing

__all__ = [
    "CUDNN_TABLES",
    "ENV_COMPUTE",
    "ENV_CONTEXT",
    "ENV_CUDNN_TABLES",
    "ENV_EVENT_POLLS",
    "ENV_GPU",
    "ENV_MEMORY",
    "ENV_EXCHANGE",
    "ENV_ROUTING",
    "ENV_SHARED",
    "Preset",
    "VirtualGpuError",
    "activate",
    "activate_from_environment",
    "active",
    "available",
    "device_spec",
    "environment",
    "parse_gpus",
    "parse_mode",
    "parse_routing",
    "presets",
    "state",
]

ENV_GPU = "ALLOCSCOPE_VGPU"  # "H100-80GB", "2xH100-80GB", "H100-80GB,A100-40GB"
ENV_MEMORY = "ALLOCSCOPE_VGPU_MEMORY"  # bytes: every device's total memory
ENV_CONTEXT = "ALLOCSCOPE_VGPU_CONTEXT"  # bytes: the CUDA context's share of each device
ENV_EVENT_POLLS = "ALLOCSCOPE_VGPU_EVENT_POLLS"  # queries an event stays pending for (default 1)
# A file through which the processes of a run share their cards (csrc/vgpu/shared.h)
ENV_SHARED = "ALLOCSCOPE_VGPU_SHARED"

ENV_TRITON_LIBCUDA = "TRITON_LIBCUDA_PATH"
LIB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")
# The linker's names of the stand-in driver and runtime (libcuda.so,
# libcudart.so), for code built at run time (FlashInfer's JIT kernels).
LINK_DIR = os.path.join(LIB_DIR, "link")
_CORE = "libvgpu.so"


class VirtualGpuError(InputError, RuntimeError):
    """The virtual GPU cannot be used as asked (the message says why, in one line)."""


@dataclasses.dataclass(frozen=True)
class Preset:
    """A GPU model the virtual GPU can be, as torch will report it."""

    key: str  # what --gpu takes: "H100-80GB"
    name: str  # torch.cuda.get_device_name()
    total_memory: int  # bytes, as cudaMemGetInfo reports on a typical card
    major: int
    minor: int
    multi_processor_count: int
    l2_cache_size: int


def _libraries() -> list[str]:
    """The stand-ins in load order (each after what it links), whatever CUDA
    major version they were built for."""
    names = sorted(os.listdir(LIB_DIR)) if os.path.isdir(LIB_DIR) else []
    order = ["libvgpu.so", "libcuda.so.1", "libnvidia-ml.so.1", "libcublasLt.so.", "libcublas.so.", "libcudart.so.",
             "libnccl.so.2", "libcudnn.so.9"]
    return [n for prefix in order for n in names if n == prefix or (prefix.endswith(".") and n.startswith(prefix))]


def available() -> bool:
    """Whether this allocscope was built with the virtual GPU (it needs a CUDA
    build of torch and the CUDA headers at build time)."""
    return len([n for n in _libraries() if not n.startswith(("libnccl", "libcudnn"))]) == 6


def _core() -> ctypes.CDLL:
    if not available():
        raise VirtualGpuError("this allocscope was built without the virtual GPU (it needs a CUDA build of torch "
                              "and the CUDA runtime headers when it is built)")
    # libvgpu.so has no CUDA library's name: loading it changes nothing for torch.
    lib = ctypes.CDLL(os.path.join(LIB_DIR, _CORE))
    lib.allocscope_vgpu_presets_json.restype = ctypes.c_char_p
    lib.allocscope_vgpu_state_json.restype = ctypes.c_char_p
    return lib


def presets() -> list[Preset]:
    """Every GPU model the virtual GPU can be."""
    return [Preset(**p) for p in json.loads(_core().allocscope_vgpu_presets_json())]


def parse_gpus(spec: str) -> list[Preset]:
    """The devices of a spec, in order: "H100-80GB", "2xH100-80GB",
    "H100-80GB,A100-40GB", "H100-80GB-MIG-1g.10gb"; a device's own total
    memory after a colon: "H100-80GB:20GiB" (names are not case-sensitive).
    A device given its own memory is its preset with that total_memory."""
    return [preset for preset, _ in _parse(spec)]


def _parse(spec: str) -> list[tuple[Preset, int | None]]:
    """The devices of a spec and the memory each was given (None: its model's)."""
    from ..common.units import parse_bytes

    by_key = {p.key.lower(): p for p in presets()}
    devices: list[tuple[Preset, int | None]] = []
    for item in spec.split(","):
        item = item.strip()
        count = 1
        head, sep, rest = item.partition("x")
        if sep and head.isdigit():
            count, item = int(head), rest
        item, colon, size = item.partition(":")
        preset = by_key.get(item.strip().lower())
        if preset is None or not 1 <= count <= 16:
            raise VirtualGpuError(f"unknown GPU {item!r}: one of {', '.join(p.key for p in presets())} "
                                  f"(allocscope run --gpu list), optionally as NxGPU (2xH100-80GB) and with "
                                  f"its memory as GPU:SIZE (H100-80GB:20GiB)")
        memory = None
        if colon:
            try:
                memory = parse_bytes(size.strip())
            except ValueError as e:
                raise VirtualGpuError(f"{spec!r}: {e}") from None
            if memory < 2 << 20:
                raise VirtualGpuError(f"{spec!r}: a device needs at least 2 MiB, not {memory} bytes")
            preset = dataclasses.replace(preset, total_memory=memory)
        devices += [(preset, memory)] * count
    if not 1 <= len(devices) <= 16:
        raise VirtualGpuError(f"{spec!r}: between 1 and 16 devices")
    return devices


def device_spec(devices: list[Preset]) -> str:
    """The spec of these devices (parse_gpus's inverse): each preset's key,
    with its memory where it is not the model's."""
    default = {p.key: p.total_memory for p in presets()}
    return ",".join(p.key if default.get(p.key) == p.total_memory else f"{p.key}:{p.total_memory}" for p in devices)


def _settings(gpu: str, memory: int | str | None, context: int | str | None,
              event_polls: int | None, compute: str | None = None, routing: str | None = None) -> dict[str, str]:
    from ..common.units import parse_bytes

    # The stand-ins read sizes in bytes: "H100-80GB:20GiB" is written out.
    devices = _parse(gpu)
    out = {ENV_GPU: gpu if all(m is None for _, m in devices) else
           ",".join(p.key if m is None else f"{p.key}:{m}" for p, m in devices)}
    for name, value, minimum in ((ENV_MEMORY, memory, 2 << 20), (ENV_CONTEXT, context, 0)):
        if value is None:
            continue
        try:
            n = value if isinstance(value, int) else parse_bytes(str(value))
        except ValueError as e:
            raise VirtualGpuError(str(e)) from None
        if n < minimum:
            raise VirtualGpuError(f"{name}: {n} bytes is too small")
        out[name] = str(n)
    if event_polls is not None:
        if not 0 <= int(event_polls) <= 1_000_000:
            raise VirtualGpuError(f"event_polls must be between 0 and 1000000, not {event_polls}")
        out[ENV_EVENT_POLLS] = str(int(event_polls))
    try:
        if compute is not None:
            out[ENV_COMPUTE] = parse_mode(compute)
        if routing is not None:
            out[ENV_ROUTING] = str(parse_routing(routing))
    except ValueError as e:
        raise VirtualGpuError(str(e)) from None
    return out


# What a library cannot do on the virtual GPU, switched to its own fallback
# where the user has not chosen:
# - FlashInfer's sampler (vLLM's default on the card) is built with nvcc and
#   CUDA's headers on first use; vLLM's PyTorch sampler is not;
# - FlashInfer's CuTe DSL norms (SGLang's) run in a library that carries
#   NVIDIA's own CUDA runtime, linked in, which needs the driver's private
#   tables (cuGetExportTable) before it counts a device; its CUDA norms are
#   built against the stand-in runtime.
ENGINE_FALLBACKS = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "FLASHINFER_USE_CUDA_NORM": "1"}


def environment(gpu: str, *, memory: int | str | None = None, context: int | str | None = None,
                event_polls: int | None = None, compute: str | None = None, routing: str | None = None,
                base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process that runs on the virtual GPU: every
    Python process started with it (and its own children) switches the
    virtual GPU on at startup, through allocscope's sitecustomize.

        subprocess.run([sys.executable, "train.py"], env=allocscope.vgpu.environment("A100-40GB"))
    """
    from ..common.startup import with_bootstrap

    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in (ENV_GPU, ENV_MEMORY, ENV_CONTEXT, ENV_EVENT_POLLS, ENV_SHARED, ENV_EXCHANGE)}
    env.update(_settings(gpu, memory, context, event_polls, compute, routing))
    for name, value in ENGINE_FALLBACKS.items():
        env.setdefault(name, value)
    env["LIBRARY_PATH"] = _link_path(env.get("LIBRARY_PATH", ""))
    return with_bootstrap(env)


def _link_path(path: str) -> str:
    """LIBRARY_PATH with LINK_DIR first: code built at run time links against
    the stand-ins, as on a card against the driver and the toolkit."""
    rest = [p for p in path.split(os.pathsep) if p and p != LINK_DIR]
    return os.pathsep.join([LINK_DIR, *rest])


def _loaded_cuda_runtime() -> str | None:
    """The path of the libcudart loaded in this process, if any."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split(maxsplit=5)[-1].strip()
                if "/libcudart.so" in path:
                    return path
    except OSError:
        pass
    return None


def active() -> bool:
    """Whether this process runs on the virtual GPU."""
    path = _loaded_cuda_runtime()
    return path is not None and os.path.dirname(path) == LIB_DIR


def activate(gpu: str, *, memory: int | str | None = None, context: int | str | None = None,
             event_polls: int | None = None, compute: str | None = None, routing: str | None = None) -> None:
    """Switches this process to the virtual GPU (and the Python processes it
    starts, through the environment). Must run before torch is imported.

    gpu: "H100-80GB", "2xH100-80GB", "H100-80GB,A100-40GB", "H100-80GB:20GiB"
    (see presets() and parse_gpus()).
    memory: every device's total memory instead of the preset's ("12GiB"),
    but for a device given its own in `gpu`.
    context: the CUDA context's share of each device (default 512 MiB).
    event_polls: how many queries an event stays pending for (default 1).
    compute: which ops compute their values: "values" (those that steer shapes and control flow, the
    default), "all" (every op that can, on the host: slow, exact), "none" (docs/vgpu.md, "Values").
    routing: what a top-k over uncomputed values (an MoE router's) picks: "balanced" (the default),
    "balanced:1.5" (the busiest expert gets 1.5 times the mean), "worst", "computed".
    """
    settings = _settings(gpu, memory, context, event_polls, compute, routing)
    if active():
        current = {k: os.environ[k] for k in (ENV_GPU, ENV_MEMORY, ENV_CONTEXT, ENV_EVENT_POLLS, ENV_COMPUTE,
                                              ENV_ROUTING) if k in os.environ and k in settings}
        if current != settings:
            raise VirtualGpuError(f"the virtual GPU is already on here as {current}; start a new process to change it")
        return
    runtime = _loaded_cuda_runtime()
    if runtime is not None or "torch" in sys.modules:
        raise VirtualGpuError("torch was imported before the virtual GPU was switched on: switch it on first "
                              "(allocscope run --gpu, pytest --vgpu, or allocscope.vgpu.activate before import torch)")
    if not available():
        _core()  # raises with the reason
    # The stand-ins read their settings from the environment; the Python
    # processes this one starts inherit them, and the bootstrap.
    from ..common.startup import with_bootstrap

    for name in (ENV_GPU, ENV_MEMORY, ENV_CONTEXT, ENV_EVENT_POLLS, ENV_COMPUTE, ENV_ROUTING):
        os.environ.pop(name, None)
    os.environ.update(settings)
    os.environ["LIBRARY_PATH"] = _link_path(os.environ.get("LIBRARY_PATH", ""))
    os.environ["PYTHONPATH"] = with_bootstrap({"PYTHONPATH": os.environ.get("PYTHONPATH", "")})["PYTHONPATH"]
    # and on sys.path: some launchers give their children this process's
    # sys.path as PYTHONPATH (Inductor's compile workers do), and Triton in
    # a worker without the virtual GPU finds no GPU to compile for.
    from ..common.startup import BOOTSTRAP_DIR

    if BOOTSTRAP_DIR not in sys.path:
        sys.path.insert(0, BOOTSTRAP_DIR)
    # Triton links its launchers against libcuda.so.1, which it looks for
    # with ldconfig unless told where: here, the stand-in driver.
    os.environ[ENV_TRITON_LIBCUDA] = LIB_DIR
    os.environ.setdefault(ENV_CUDNN_TABLES, CUDNN_TABLES)
    # Loaded globally, by path: torch's libraries then find these under the
    # names they link against (the loader matches a loaded library's SONAME
    # before it searches any path), and c10 finds libcuda.so.1 and
    # libnvidia-ml.so.1 when it opens them by name.
    for name in _libraries():
        ctypes.CDLL(os.path.join(LIB_DIR, name), mode=ctypes.RTLD_GLOBAL)

    from ..common.torch_hook import after_torch_import

    from .cudnn import stand_in

    if not stand_in():
        after_torch_import(_turn_cudnn_off)
    after_torch_import(_exit_grace)
    after_torch_import(_distributed)
    after_torch_import(_values)


def _turn_cudnn_off() -> None:
    # Built without the cuDNN stand-in (no cuDNN 9 headers at build time): the
    # real cuDNN needs a driver; torch's native kernels take its place (docs/vgpu.md).
    # scaled_dot_product_attention's cuDNN backend does not follow
    # cudnn.enabled: it is chosen first for bf16/fp16 on Hopper and fails with
    # CUDNN_STATUS_NOT_INITIALIZED, so it is turned off too (flash or
    # memory-efficient attention take its place).
    import torch

    torch.backends.cudnn.enabled = False
    torch.backends.cuda.enable_cudnn_sdp(False)


def _distributed() -> None:
    from .distributed import install

    install()


def _values() -> None:
    from .values import install_values

    install_values()


# How long the interpreter waits at exit for autograd's device threads.
EXIT_GRACE_S = 0.05


def _exit_grace() -> None:
    """torch >= 2.14 keeps a Python object (the contextvars context) in every
    backward's thread-local state, which the CUDA device thread releases
    after backward() has returned. If the interpreter is already finalizing
    then, Python (< 3.14) ends that thread with pthread_exit inside a
    noexcept destructor and the process aborts ("terminate called without
    an active exception"). On the virtual GPU backward takes no time, so a
    script's last backward is often that close to its exit: seen in about 1
    of 10 runs of short training scripts on a loaded machine. An atexit
    handler (it runs before finalization) releases the GIL for a moment so
    that the thread can finish."""
    import atexit
    import time

    atexit.register(time.sleep, EXIT_GRACE_S)


def activate_from_environment() -> None:
    """At interpreter startup (sitecustomize): switch the virtual GPU on if
    the environment asks for it. Errors are one line on stderr."""
    gpu = os.environ.get(ENV_GPU)
    if not gpu:
        return
    try:
        polls = os.environ.get(ENV_EVENT_POLLS)
        activate(gpu, memory=os.environ.get(ENV_MEMORY), context=os.environ.get(ENV_CONTEXT),
                 event_polls=int(polls) if polls else None, compute=os.environ.get(ENV_COMPUTE) or None,
                 routing=os.environ.get(ENV_ROUTING) or None)
    except (VirtualGpuError, ValueError, OSError) as e:
        print(f"allocscope: no virtual GPU in this process ({sys.executable}): {e}", file=sys.stderr)


def state() -> dict[str, Any]:
    """The virtual devices and their memory now: {"devices": [{"key", "total",
    "context_bytes", "used", "own", "nccl", "nccl_peak", "other_processes",
    "other_contexts", "contexts_created"}, ...], "event_polls": n}. `used`
    counts what a real card's "used" does: contexts and allocations, in 2 MiB
    units, of every process of the run sharing the card (docs/vgpu.md, "Many
    GPUs"); `own` this process's alone, `nccl` / `nccl_peak` NCCL's own
    buffers now and at their most, `other_processes` and `other_contexts`
    what the run's other processes hold there now, `contexts_created` the
    contexts created there by any of them, ever."""
    if not active():
        raise VirtualGpuError("the virtual GPU is not on in this process")
    return json.loads(_core().allocscope_vgpu_state_json())
