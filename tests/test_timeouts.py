"""A test that times out must not break the tests after it on the same worker (conftest.py)."""
from __future__ import annotations

import signal
import time

import pytest

from conftest import resync_after_timeout


class Interrupted(BaseException):
    """What pytest-timeout's SIGALRM handler raises (pytest.fail's, a BaseException: py4j lets it
    through without closing the connection) in the middle of whatever runs."""


def _raise(*_: object) -> None:
    raise Interrupted


def test_a_jvm_call_cut_by_a_timeout_leaves_the_session_usable(spark):
    jvm = spark.sparkContext._jvm
    previous = signal.signal(signal.SIGALRM, _raise)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        # pytest keeps the failed test's traceback, and with it the interrupted connection.
        with pytest.raises(Interrupted) as kept:
            jvm.java.lang.Thread.sleep(2000)  # its answer comes after the interruption
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    time.sleep(2)  # the interrupted call's answer arrives meanwhile, unread
    resync_after_timeout()
    assert isinstance(kept.value, Interrupted)
    assert jvm.java.lang.Math.abs(-3) == 3
    assert spark.range(7).count() == 7
