"""Ranks run together (harness/child.wait_for_all): one that fails does not leave the others waiting for it."""

import signal
import sys

import pytest

from allocscope.harness import child

pytestmark = pytest.mark.torch_agnostic


def test_once_one_fails_the_others_are_stopped_after_the_grace(monkeypatch):
    monkeypatch.setattr(child, "PEER_FAILED_GRACE_S", 0.5)
    statuses = child.wait_for_all([([sys.executable, "-c", "raise SystemExit(3)"], {}, None),
                                   ([sys.executable, "-c", "import time; time.sleep(60)"], {}, None)])
    assert statuses == [3, 128 + signal.SIGTERM]  # stopped, not waited for to the end of its 60 s


def test_all_succeeding_are_all_waited_for():
    statuses = child.wait_for_all([([sys.executable, "-c", "import time; time.sleep(0.3)"], {}, None),
                                   ([sys.executable, "-c", "pass"], {}, None)])
    assert statuses == [0, 0]
