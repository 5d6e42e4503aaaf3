"""The prolog's user-chosen strings (a job's name; its account where accounting does not enforce it)
reach Python as lone surrogates when they are not UTF-8: the registration carries them as the wire
takes them, instead of being refused whole."""

from __future__ import annotations

import pytest

from jobsight.agent.slurm.hooks import _text
from jobsight.protocol import wire


def test_bytes_that_are_not_utf8_become_text_the_wire_takes() -> None:
    raw = b"train\xff\xfe run".decode("utf-8", "surrogateescape")  # as os.environ holds them
    record = {"kind": "job_started", "job": "7", "ts": wire.now_us(), "name": raw, "account": raw}
    with pytest.raises(wire.WireError, match="surrogate"):
        wire.validate_record(record, 0)
    cleaned = {**record, "name": _text(raw), "account": _text(raw)}
    assert wire.validate_record(cleaned, 0)["name"] == "train\\xff\\xfe run"
    assert (_text(None), _text(""), _text("plain")) == (None, None, "plain")
