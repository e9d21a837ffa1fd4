"""reports/what_fits.py: the one-run estimate of the largest value that
fits, and the search command the post-mortem proposes, from the run's own
command."""

import types

import pytest

from allocscope.reports.what_fits import _command, estimate_largest

pytestmark = pytest.mark.torch_agnostic

MiB = 1 << 20


def test_the_estimate_scales_what_is_not_fixed():
    # 900 MiB needed at 1000, 100 fixed: 0.8 MiB a unit; 500 MiB for the rest of a 600 MiB limit -> 625
    assert estimate_largest(1000, 900 * MiB, 100 * MiB, 0, 600 * MiB) == 625
    # state the run would still make (an optimizer not stepped yet) comes off the room first
    assert estimate_largest(1000, 900 * MiB, 100 * MiB, 100 * MiB, 600 * MiB) == 500
    assert estimate_largest(1000, 100 * MiB, 100 * MiB, 0, 600 * MiB) is None  # nothing grows with the value
    assert estimate_largest(1000, 900 * MiB, 100 * MiB, 0, 50 * MiB) == 0  # not even 1


def cap(argv):
    return types.SimpleNamespace(metadata={"argv": argv})


def test_the_search_command_puts_the_value_where_the_command_gives_it():
    fit = {"command": ["python", "train.py", "--batch", "64"], "template": None}
    line = _command(cap([]), fit, "BATCH", 64, "L4-24GB")
    assert line == "allocscope fit --gpu L4-24GB --search BATCH=1..63 -- python train.py --batch '{BATCH}'"
    # a template with its own {NAME}: as given
    fit = {"command": ["python", "t.py", "8"], "template": ["python", "t.py", "{N}"]}
    assert _command(cap([]), fit, "N", 8, "T4-16GB").endswith("--search N=1..7 -- python t.py '{N}'")
    # the value nowhere in the command (a constant in the script): where to put it is said
    line = _command(cap(["big.py"]), {}, "BATCH", 65536, None)
    assert line.startswith("allocscope fit --gpu YOUR-GPU --search BATCH=1..65535 -- python big.py  (with {BATCH}")
