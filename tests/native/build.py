"""Builds allocscope_testing, the tests' native harness (csrc/testing/: a fake
CUDA allocator, the stack walker's self-check, the column encoder), into
this folder, against the installed torch, with the package's own build
settings (setup.py). It is never installed with allocscope.

    python tests/native/build.py          # make test does this after building allocscope
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def build() -> None:
    sys.path.insert(0, ROOT)
    import setup as package  # the package's setup.py: its flags, CUDA headers and sources
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension

    os.chdir(ROOT)
    setup(name="allocscope-testing", ext_modules=[package.testing_extension("tests.native.allocscope_testing")],
          cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
          script_args=["-q", "build_ext", "--inplace", "--build-temp", os.path.join("build", "testing")])


def main() -> int:
    """Builds in a child process whose output (each compiler command) is
    shown only when the build fails."""
    result = subprocess.run([sys.executable, __file__, "--build"], capture_output=True, text=True)
    if result.returncode != 0:
        print(result.stdout + result.stderr, file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    if sys.argv[1:] == ["--build"]:
        build()
    else:
        sys.exit(main())
