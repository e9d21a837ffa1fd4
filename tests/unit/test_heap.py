"""The allocscope command's own memory settings (common/heap.py): in its
process, large arrays come without huge pages and freed memory is used
again without the kernel faulting in (and zeroing) fresh pages; a user's
process keeps its own. Each case runs in a child: the settings are a
process's."""

import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.torch_agnostic,
              pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")]

# faults taken by writing a 256 MiB array after an earlier one was freed
FAULTS_OF_A_SECOND_ARRAY = textwrap.dedent("""
    import resource, sys
    if sys.argv[1] == "command":
        from allocscope.common.heap import reuse_freed_memory
        reuse_freed_memory()
    import numpy as np
    core = getattr(np, "_core", None) or np.core
    huge = core.multiarray._set_madvise_hugepage(True)
    core.multiarray._set_madvise_hugepage(huge)
    n = 256 * 2**20 // 8
    a = np.ones(n); del a
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    b = np.ones(n)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, int(huge))
""")


def faults_and_huge_pages(heap: str) -> tuple[int, bool]:
    out = subprocess.run([sys.executable, "-c", FAULTS_OF_A_SECOND_ARRAY, heap], capture_output=True, text=True,
                         check=True).stdout.split()
    return int(out[0]), bool(int(out[1]))


def test_the_commands_process_writes_a_second_large_array_into_memory_it_already_has():
    faults, huge = faults_and_huge_pages("command")
    assert not huge
    # 65,536 pages of 4 KiB were faulted in for the first array; the second
    # takes them again (a few faults at most, for the heap's own pages)
    assert faults < 100, faults


def test_a_process_that_is_not_the_commands_keeps_numpys_and_glibcs_defaults():
    faults, huge = faults_and_huge_pages("default")
    # the second array is mapped afresh: a fault per huge page (numpy's
    # default where the kernel allows it) or per 4 KiB page
    assert faults >= 128, faults


def test_python_m_allocscope_takes_the_commands_settings(tmp_path):
    # the entry point calls it before any command; --version exits inside
    # argparse, after the settings were taken
    code = ("import runpy, sys, numpy as np\n"
            "sys.argv = ['allocscope', '--version']\n"
            "try:\n    runpy.run_module('allocscope', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "core = getattr(np, '_core', None) or np.core\n"
            "print(int(core.multiarray._set_madvise_hugepage(True)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "0"
