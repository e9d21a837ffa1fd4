"""Builds allocscope and its native core, allocscope._C.

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


def _extension():
    import torch
    from torch.utils.cpp_extension import CppExtension, library_paths

    sources = [
        "csrc/bindings.cpp",
        "csrc/crc32.cpp",
        "csrc/cpu_allocator.cpp",
        "csrc/pystack.cpp",
        "csrc/recorder.cpp",
        "csrc/stacks.cpp",
        "csrc/tables.cpp",
        "csrc/writer.cpp",
        "csrc/testing/bindings.cpp",
    ]
    include_dirs = [os.path.join(HERE, "csrc")]
    libraries = ["c10"]
    define_macros = []
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
        sources += ["csrc/cuda_allocator.cpp", "csrc/cuda_baseline.cpp", "csrc/testing/fake_cuda.cpp"]
        include_dirs.append(cuda_include)
        libraries.append("c10_cuda")
        define_macros.append(("ALLOCSCOPE_WITH_CUDA", "1"))
    opt = os.environ.get("ALLOCSCOPE_OPT", "-O2")
    return CppExtension(
        name="allocscope._C",
        sources=sources,
        include_dirs=include_dirs,
        libraries=libraries,
        define_macros=define_macros,
        extra_compile_args=[opt, "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        # So that _C finds torch's libraries even if torch was not imported first.
        extra_link_args=[f"-Wl,-rpath,{p}" for p in library_paths()],
    )


def main() -> None:
    from torch.utils.cpp_extension import BuildExtension

    setup(
        name="allocscope",
        version="0.1.0",
        description="Byte-for-byte attribution of PyTorch GPU memory",
        package_dir={"": "python"},
        packages=find_packages("python"),
        package_data={"allocscope": ["py.typed", "_C.pyi", "html/*.html", "html/*.js", "html/*.css"]},
        ext_modules=[_extension()],
        cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
        python_requires=">=3.10",
        install_requires=["numpy"],
        entry_points={"console_scripts": ["allocscope = allocscope.cli:main"]},
    )


if __name__ == "__main__":
    main()
