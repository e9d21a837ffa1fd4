"""Builds allocscope, its native core (allocscope._C), its analysis loops
(allocscope._analysis) and the virtual GPU's stand-in CUDA libraries.

Build against the torch it will run with (the allocator interface changes
between releases): ``pip install --no-build-isolation -e .``.

CUDA support is decided by whether the installed torch is a CUDA build, never
by whether a GPU is present. No .cu sources: the CUDA part is C++ that needs
the CUDA runtime headers (from a toolkit or from the nvidia wheels torch
depends on) and links c10_cuda only.
"""

import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _opt_flags() -> list[str]:
    """The optimisation flags of every binary: $ALLOCSCOPE_OPT (e.g. "-O0 -g"
    for a debug build), else -O2 without debug information. Python's own
    CFLAGS, which extensions inherit, carry -g: with torch's headers, debug
    information doubled each file's compile time (fingerprints.cpp: 41.5 s
    with it, 22.7 s without), and the builds are most of make test's set-up."""
    return os.environ.get("ALLOCSCOPE_OPT", "-O2 -g0").split()


def _cuda_include_dir() -> str | None:
    """The folder holding cuda_runtime_api.h, or None."""
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(os.path.join(os.environ["CUDA_HOME"], "include"))
    nvcc = shutil.which("nvcc")
    if nvcc:
        # The first nvcc on PATH may be a wrapper script; ask it where it lives.
        try:
            out = subprocess.run(
                [nvcc, "--dryrun", "-x", "cu", "-E", "/dev/null"],
                capture_output=True, text=True, timeout=60,
            )
            m = re.search(r"^#\$ _HERE_=(.*)$", out.stderr + out.stdout, re.M)
            if m:
                candidates.append(os.path.join(os.path.dirname(m.group(1).strip()), "include"))
        except (OSError, subprocess.SubprocessError):
            pass
    candidates.append("/usr/local/cuda/include")
    for site in sys.path:
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "include")))
        candidates.append(os.path.join(site, "nvidia", "cuda_runtime", "include"))
    for c in candidates:
        if os.path.isfile(os.path.join(c, "cuda_runtime_api.h")):
            return c
    return None


def _cuda_major() -> int | None:
    import torch

    return int(torch.version.cuda.split(".")[0]) if torch.version.cuda else None


def _vgpu_include_dirs(major: int) -> list[str] | None:
    """Folders holding the CUDA runtime, driver and cuBLAS headers of CUDA
    `major` (the stand-ins must match the struct layouts torch was built
    with): the nvidia wheels torch depends on first, then a toolkit."""
    needed = ["cuda_runtime_api.h", "cuda.h", "cublas_api.h", "cublasLt.h"]
    candidates = []
    for site in sys.path:
        candidates += [os.path.join(site, "nvidia", f"cu{major}", "include"),
                       os.path.join(site, "nvidia", "cuda_runtime", "include"),
                       os.path.join(site, "nvidia", "cublas", "include")]
    general = _cuda_include_dir()
    if general:
        candidates.append(general)
    found: dict[str, str] = {}
    for c in candidates:
        for h in needed:
            if h not in found and os.path.isfile(os.path.join(c, h)):
                found[h] = c
    if len(found) < len(needed):
        return None
    with open(os.path.join(found["cuda_runtime_api.h"], "cuda_runtime_api.h")) as f:
        m = re.search(r"#define CUDART_VERSION\s+(\d+)", f.read())
    if not m or int(m.group(1)) // 1000 != major:
        return None
    # The wheels' headers include crt/host_defines.h, which only a toolkit has
    # (or the nvidia-cuda-crt wheel): its macros do not change with the version.
    return list(dict.fromkeys([*found.values(), *([general] if general else [])]))


# The virtual GPU's stand-in libraries (csrc/vgpu/, docs/vgpu.md): file name
# (= SONAME), sources, libraries of ours it links, and the symbol version node
# torch's imports name (None: unversioned, as the real library is).
def _vgpu_libraries(major: int) -> list[tuple[str, list[str], list[str], str | None]]:
    return [
        ("libvgpu.so", ["devices.cpp", "memory.cpp", "shared.cpp", "streams.cpp"], [], None),
        ("libcuda.so.1", ["driver.cpp", "cubin.cpp"], ["libvgpu.so"], None),
        (f"libcudart.so.{major}", ["cudart.cpp", "cudart_memory.cpp", "cudart_streams.cpp"],
         ["libcuda.so.1", "libvgpu.so"], f"libcudart.so.{major}"),
        ("libnvidia-ml.so.1", ["nvml.cpp"], ["libvgpu.so"], None),
        (f"libcublasLt.so.{major}", ["cublaslt.cpp"], [], f"libcublasLt.so.{major}"),
        (f"libcublas.so.{major}", ["cublas.cpp", "cublas_inert.cpp"], ["libvgpu.so"], f"libcublas.so.{major}"),
        # Unversioned, as the real libnccl.so.2 is.
        ("libnccl.so.2", ["nccl.cpp", "nccl_exchange.cpp"], ["libvgpu.so"], None),
        ("libcudnn.so.9", ["cudnn_backend.cpp", "cudnn_legacy.cpp", "cudnn_rnn.cpp", "cudnn_tables.cpp"],
         ["libvgpu.so"], "libcudnn.so.9"),
    ]


def _vgpu_exports(name: str) -> str:
    """The symbols a stand-in library exports, as a version script's globs:
    its API's prefix (libcudart.so.13 -> cuda*), and for libvgpu.so, the core
    the others call into."""
    prefix = name.split(".")[0][3:]
    if prefix == "vgpu":
        return 'extern "C++" { vgpu::*; }; allocscope_vgpu_*;'
    if prefix == "cudart":
        return "cuda*; __cuda*;"
    if prefix == "cuda":  # and the table of entry points the runtime asks the driver for
        return "cu*; vgpu_*;"
    if prefix == "nvidia-ml":
        return "nvml*;"
    return f"{prefix}*;"


def _nccl_include_dir() -> str | None:
    """The folder of the nccl.h torch was built against (the nvidia-nccl
    wheel torch depends on)."""
    for site in sys.path:
        d = os.path.join(site, "nvidia", "nccl", "include")
        if os.path.isfile(os.path.join(d, "nccl.h")):
            return d
    return None


def _cudnn_include_dir() -> str | None:
    """The folder of the cudnn.h torch was built against (the nvidia-cudnn
    wheel torch depends on), where its major version is 9 as the stand-in's."""
    for site in sys.path:
        d = os.path.join(site, "nvidia", "cudnn", "include")
        version = os.path.join(d, "cudnn_version.h")
        if os.path.isfile(version):
            with open(version) as f:
                m = re.search(r"#define CUDNN_MAJOR\s+(\d+)", f.read())
            if m and m.group(1) == "9":
                return d
    return None


def build_vgpu(out_dir: str, work_dir: str) -> bool:
    """Builds the stand-in CUDA libraries into out_dir. No torch headers, no
    nvcc: plain C++ against the CUDA headers. Returns False (and says why)
    where they cannot be built."""
    major = _cuda_major()
    if major is None:
        return False
    includes = _vgpu_include_dirs(major)
    if includes is None:
        print(f"allocscope: CUDA {major} runtime/driver/cuBLAS headers not found: the virtual GPU is not built",
              file=sys.stderr)
        return False
    cxx = os.environ.get("CXX", "c++")
    src = os.path.join(HERE, "csrc", "vgpu")
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(work_dir, exist_ok=True)
    opt = _opt_flags()
    nccl = _nccl_include_dir()
    cudnn = _cudnn_include_dir()
    for name, sources, links, version_node in _vgpu_libraries(major):
        extra = []
        if name.startswith("libnccl"):
            if nccl is None:
                print("allocscope: nccl.h not found: the virtual GPU has no NCCL", file=sys.stderr)
                continue
            extra = [nccl]
        if name.startswith("libcudnn"):
            if cudnn is None:
                print("allocscope: cuDNN 9's headers not found: the virtual GPU runs without cuDNN", file=sys.stderr)
                continue
            extra = [cudnn]
        cmd = [cxx, "-std=c++17", *opt, "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra",
               "-Wno-unused-parameter", "-Wno-deprecated-declarations", f"-I{src}"]
        cmd += [f"-I{d}" for d in [*includes, *extra]]
        cmd += [os.path.join(src, s) for s in sources]
        cmd += ["-o", os.path.join(out_dir, name), f"-Wl,-soname,{name}", f"-L{out_dir}", "-Wl,-rpath,$ORIGIN",
                "-Wl,--no-undefined"]
        cmd += [f"-l:{lib}" for lib in links]
        # Each exports its API and nothing else. These are loaded globally
        # before torch (vgpu.activate), so any other symbol they exported
        # would stand in for torch's own: the weak instantiations of the C++
        # library's inline functions and templates that every object file
        # carries (std::vector's, and with GCC 13's headers exception_ptr's
        # reference counting among them). On the GPU machines (GCC 13's
        # library) every exception caught in torch arrived as "e_ptr INTERNAL
        # ASSERT FAILED" while the stand-ins exported those; since they export
        # their API alone, all arrive intact there (docs/vgpu.md, "Exceptions
        # on the GPU machine": an H200 machine of the same image, 2026-11-26).
        script = os.path.join(work_dir, f"{name}.map")
        with open(script, "w") as f:
            f.write(f"{version_node or ''} {{ global: {_vgpu_exports(name)} local: *; }};\n")
        cmd.append(f"-Wl,--version-script={script}")
        subprocess.run(cmd, check=True)
    # The linker's names of the driver and the runtime, for programs that
    # build CUDA code at run time and link it with -lcuda -lcudart
    # (FlashInfer's JIT kernels): vgpu.environment() puts this on LIBRARY_PATH.
    link = os.path.join(out_dir, "link")
    os.makedirs(link, exist_ok=True)
    for name, target in (("libcuda.so", "libcuda.so.1"), ("libcudart.so", f"libcudart.so.{major}")):
        path = os.path.join(link, name)
        if os.path.lexists(path):
            os.remove(path)
        os.symlink(os.path.join("..", target), path)
    return True


# What each product is built from: one folder per binary (csrc/recorder/ for
# _C, csrc/analysis/ for _analysis, csrc/vgpu/ for the stand-in libraries,
# csrc/testing/ for the test-only extension), and the format they share
# (csrc/format/). Includes are relative to csrc/.
_FORMAT_SOURCES = ["csrc/format/chunk.cpp", "csrc/format/columns.cpp"]
_RECORDER_SOURCES = ["csrc/recorder/" + f for f in ("backward_scopes.cpp", "bindings.cpp", "checkpoint.cpp",
                                                    "cpu_allocator.cpp", "fingerprints.cpp", "gradients.cpp",
                                                    "module_hooks.cpp", "ops.cpp", "pystack.cpp", "recorder.cpp",
                                                    "saved.cpp", "saved_engine.cpp", "stacks.cpp", "tables.cpp",
                                                    "writer.cpp")]
_RECORDER_CUDA_SOURCES = ["csrc/recorder/cuda_allocator.cpp", "csrc/recorder/cuda_baseline.cpp",
                          "csrc/recorder/value_kernels.cpp"]
_ANALYSIS_SOURCES = ["csrc/analysis/" + f for f in ("bindings.cpp", "decode.cpp", "model.cpp", "pairs.cpp",
                                                    "recorded.cpp", "replay.cpp", "scopes.cpp", "sizes.cpp")]
_TESTING_SOURCES = ["csrc/testing/bindings.cpp", "csrc/recorder/pystack.cpp", "csrc/format/columns.cpp"]
_TESTING_CUDA_SOURCES = ["csrc/testing/fake_cuda.cpp"]


def _torch_extension(name: str, sources: list[str], cuda_sources: list[str]):
    """A C++ extension against the installed torch (c10; c10_cuda where torch
    is a CUDA build), with CUDA's runtime headers but no .cu sources."""
    import torch
    from torch.utils.cpp_extension import CppExtension, library_paths

    sources = list(sources)
    libraries = ["c10"]
    define_macros = []
    include_dirs = [os.path.join(HERE, "csrc")]
    with_cuda = torch.version.cuda is not None
    if os.environ.get("ALLOCSCOPE_NO_CUDA") == "1":
        with_cuda = False
    if with_cuda:
        cuda_include = _cuda_include_dir()
        if cuda_include is None:
            sys.exit(
                "allocscope: torch is a CUDA build but no CUDA runtime headers were found "
                "(cuda_runtime_api.h). Set CUDA_HOME to a CUDA toolkit, or set "
                "ALLOCSCOPE_NO_CUDA=1 for a CPU-only build."
            )
        sources += cuda_sources
        include_dirs.append(cuda_include)
        libraries.append("c10_cuda")
        define_macros.append(("ALLOCSCOPE_WITH_CUDA", "1"))
    opt = _opt_flags()
    return CppExtension(
        name=name,
        sources=sources,
        include_dirs=include_dirs,
        libraries=libraries,
        define_macros=define_macros,
        extra_compile_args=[*opt, "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        # So that the extension finds torch's libraries even if torch was not imported first.
        extra_link_args=[f"-Wl,-rpath,{p}" for p in library_paths()],
    )


def _extension():
    """allocscope._C: the recorder (allocator wrappers, stacks, the writer)."""
    return _torch_extension("allocscope._C", _RECORDER_SOURCES + _FORMAT_SOURCES, _RECORDER_CUDA_SOURCES)


def testing_extension(name: str):
    """The test-only harness (a fake CUDA allocator, the stack walker's
    self-check, the column encoder): built by tests/native/build.py for
    the tests, never part of the package."""
    return _torch_extension(name, _TESTING_SOURCES, _TESTING_CUDA_SOURCES)


def _analysis_extension():
    """The analysis' hot loops (csrc/analysis/): plain C++ and pybind11, no
    torch, so that analysing a capture never imports torch."""
    from setuptools import Extension

    try:
        import pybind11

        pybind_include = [pybind11.get_include()]
    except ImportError:  # torch ships pybind11's headers too (machines without the package)
        from torch.utils.cpp_extension import include_paths

        pybind_include = include_paths()[:1]
    opt = _opt_flags()
    return Extension(
        name="allocscope._analysis",
        sources=_ANALYSIS_SOURCES,
        include_dirs=[os.path.join(HERE, "csrc"), *pybind_include],
        language="c++",
        extra_compile_args=[*opt, "-std=c++17", "-fvisibility=hidden", "-Wall", "-Wextra"],
    )


def _build_ext_class():
    from torch.utils.cpp_extension import BuildExtension

    class BuildExtensionAndVirtualGpu(BuildExtension):
        """Builds _C, then the virtual GPU's libraries next to it (in vgpu/lib)."""

        def run(self) -> None:
            super().run()
            target = os.path.dirname(self.get_ext_fullpath("allocscope._C"))
            build_vgpu(os.path.join(target, "vgpu", "lib"), os.path.join(self.build_temp, "vgpu"))

    return BuildExtensionAndVirtualGpu.with_options(use_ninja=True)


def _version() -> str:
    """The package's version, from its one home (python/allocscope/_version.py)."""
    with open(os.path.join(HERE, "python", "allocscope", "_version.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"$', f.read(), re.M).group(1)


def main() -> None:
    setup(
        name="allocscope",
        version=_version(),
        description="Byte-for-byte attribution of PyTorch GPU memory",
        package_dir={"": "python"},
        packages=find_packages("python"),
        package_data={"allocscope": ["py.typed", "_C.pyi", "_analysis.pyi", "reports/html/*.html", "reports/html/*.js",
                                     "reports/html/*.css", "vgpu/lib/*", "vgpu/lib/link/*", "vgpu/cudnn_tables.tsv"]},
        ext_modules=[_extension(), _analysis_extension()],
        cmdclass={"build_ext": _build_ext_class()},
        python_requires=">=3.10",
        install_requires=["numpy"],
        extras_require={"notebook": ["ipython"]},  # %load_ext allocscope (allocscope.notebook)
        entry_points={"console_scripts": ["allocscope = allocscope.cli:main"],
                      "pytest11": ["allocscope = allocscope.harness.pytest_plugin"]},
    )


if __name__ == "__main__":
    main()
