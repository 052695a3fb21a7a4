"""SIGTERM and Ctrl-C as a stop event while inside `stop_on_signals`, the previous handlers
back on leaving."""

from __future__ import annotations

import os
import signal

from tba.signals import stop_on_signals


def test_a_signal_inside_sets_the_event_and_the_old_handlers_come_back():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    with stop_on_signals("stopping") as stop:
        assert not stop.is_set()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.is_set()
    with stop_on_signals() as again:
        os.kill(os.getpid(), signal.SIGINT)
        assert again.is_set()
    assert {sig: signal.getsignal(sig) for sig in before} == before
