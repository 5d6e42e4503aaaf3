"""``data.read_ahead``: a page's reads started on threads while it draws what comes before them. The page's
own call of a reader read ahead finds it cached, or waits for it, and runs it no second time; a read
ahead that fails is dropped, for the page's own call to meet and say."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import streamlit as st

from jobsight.dashboard import data


def _started(calls: Sequence[object], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(calls)


def test_the_page_waits_for_the_read_under_way_and_does_not_run_it_again() -> None:
    calls: list[int] = []
    release = threading.Event()

    @st.cache_data(ttl=60, show_spinner=False)
    def reader(x: int) -> int:
        calls.append(x)
        release.wait(30)
        return x * 2

    data.read_ahead(lambda: reader(3))
    assert _started(calls), "the read ahead never ran"
    threading.Timer(0.2, release.set).start()  # the page's call comes while the read is under way
    assert reader(3) == 6
    assert calls == [3]
    reader.clear()


def test_a_failed_read_ahead_is_dropped_and_the_page_call_meets_the_failure_itself() -> None:
    calls: list[str] = []

    @st.cache_data(ttl=60, show_spinner=False)
    def failing() -> int:
        calls.append(threading.current_thread().name)
        raise LookupError("no such job")

    data.read_ahead(failing)
    assert _started(calls)
    try:
        failing()
    except LookupError as raised:
        assert str(raised) == "no such job"
    else:
        raise AssertionError("the page's own call did not meet the failure")
    # Nothing of the failed read was kept: the page's call ran the reader again, on its own thread.
    assert calls == ["jobsight-read-ahead", threading.current_thread().name]
