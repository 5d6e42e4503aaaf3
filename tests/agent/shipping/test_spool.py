"""The disk spool, on a real file system: order, framing, damage, caps, ownership."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jobsight.agent.shipping.spool import REJECTED_DIR, SUFFIX, Spool
from jobsight.agent.shipping.spool_format import FRAME, HEADER, MAGIC, SpooledBatch, encode_entry


def _segments(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.endswith(SUFFIX))


def _drain(spool: Spool) -> list[SpooledBatch]:
    out = []
    while (batch := spool.peek()) is not None:
        out.append(batch)
        spool.ack()
    return out


def _write_in_child(directory: Path, count: int, *, kill: bool) -> None:
    """Spool ``count`` batches in another process, then SIGKILL it (or let it close)."""
    code = textwrap.dedent(
        f"""
        import os, signal
        from jobsight.agent.shipping.spool import Spool
        spool = Spool({str(directory)!r}, 1 << 30)
        for seq in range({count}):
            assert spool.append("dead:1:1", seq, 1, b"body-%d" % seq)
        if {kill}:
            os.kill(os.getpid(), signal.SIGKILL)
        spool.close()
        """
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[3], check=False)
    assert result.returncode == (-signal.SIGKILL if kill else 0)


def test_replays_in_write_order_with_original_identity(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path), 1 << 20, segment_bytes=200)  # small segments: several files
    for seq in range(20):
        assert spool.append("node:1:2", seq, seq + 1, f"body-{seq}".encode())
    assert len(_segments(tmp_path)) > 1
    batches = _drain(spool)
    assert [(b.source, b.seq, b.records, b.body) for b in batches] == [
        ("node:1:2", seq, seq + 1, f"body-{seq}".encode()) for seq in range(20)
    ]
    assert spool.pending() == 0
    assert _segments(tmp_path) == []
    spool.close()


def test_segment_starts_with_versioned_header_and_frames_records(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path), 1 << 20)
    spool.append("s", 7, 3, b"gzip-bytes")
    spool.sync()
    (segment,) = _segments(tmp_path)
    data = segment.read_bytes()
    assert data[:8] == MAGIC
    assert HEADER.unpack_from(data)[1] == 1
    assert data[HEADER.size :] == encode_entry("s", 7, 3, b"gzip-bytes")
    spool.close()


def test_segment_is_deleted_only_after_every_batch_is_acknowledged(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path), 1 << 20)
    for seq in range(3):
        spool.append("s", seq, 1, b"x")
    for _ in range(2):
        assert spool.peek() is not None
        spool.ack()
        assert len(_segments(tmp_path)) == 1
    # Peeking is not acknowledging, and closing keeps what is unacknowledged.
    assert spool.peek() is not None
    spool.close()
    assert len(_segments(tmp_path)) == 1

    again = Spool(str(tmp_path), 1 << 20)
    assert again.adopt() == 3  # nothing was recorded as acked on disk: replays resend, the collector dedups
    assert [b.seq for b in _drain(again)] == [0, 1, 2]
    assert _segments(tmp_path) == []
    again.close()


def test_torn_last_record_is_skipped_not_fatal(tmp_path: Path) -> None:
    _write_in_child(tmp_path, 3, kill=False)
    (segment,) = _segments(tmp_path)
    torn = encode_entry("dead:1:1", 3, 1, b"body-3")
    with segment.open("ab") as handle:
        handle.write(torn[: len(torn) - 4])  # the writer died mid-append
    spool = Spool(str(tmp_path), 1 << 20)
    assert spool.adopt() == 3
    assert [b.body for b in _drain(spool)] == [b"body-0", b"body-1", b"body-2"]
    spool.close()


def test_torn_frame_header_is_skipped(tmp_path: Path) -> None:
    _write_in_child(tmp_path, 2, kill=False)
    (segment,) = _segments(tmp_path)
    with segment.open("ab") as handle:
        handle.write(b"\x00\x00\x00")  # not even a whole frame header
    spool = Spool(str(tmp_path), 1 << 20)
    assert spool.adopt() == 2
    spool.close()


def test_record_with_bad_crc_is_skipped_and_the_rest_replayed(tmp_path: Path) -> None:
    _write_in_child(tmp_path, 3, kill=False)
    (segment,) = _segments(tmp_path)
    data = bytearray(segment.read_bytes())
    first = HEADER.size
    length, _ = FRAME.unpack_from(data, first)
    second = first + FRAME.size + length
    data[second + FRAME.size + length - 1] ^= 0xFF  # flip a byte in the second record's body
    segment.write_bytes(bytes(data))
    spool = Spool(str(tmp_path), 1 << 20)
    assert spool.adopt() == 2
    assert spool.corrupt_records == 1
    assert [b.seq for b in _drain(spool)] == [0, 2]
    spool.close()


def test_segment_of_another_version_is_left_alone(tmp_path: Path) -> None:
    alien = tmp_path / f"00000000000000000001-1-0001{SUFFIX}"
    alien.write_bytes(HEADER.pack(MAGIC, 99, 0) + b"future format")
    spool = Spool(str(tmp_path), 1 << 20)
    assert spool.adopt() == 0
    spool.close()
    assert alien.exists()


def test_segment_is_locked_by_its_writer(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path), 1 << 20)
    spool.append("s", 0, 1, b"x")
    (segment,) = _segments(tmp_path)
    fd = os.open(segment, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    spool.close()


def test_a_live_writers_segments_are_not_adopted(tmp_path: Path) -> None:
    writer = Spool(str(tmp_path), 1 << 20)
    writer.append("alive:1:1", 0, 1, b"x")
    other = Spool(str(tmp_path), 1 << 20)
    assert other.adopt() == 0
    assert other.peek() is None
    writer.close()  # the writer lets go (exits): now the segment is adoptable
    assert other.adopt() == 1
    assert other.peek() == SpooledBatch("alive:1:1", 0, 1, b"x")
    other.close()


def test_segments_of_a_killed_process_are_adopted_and_replayed(tmp_path: Path) -> None:
    _write_in_child(tmp_path, 5, kill=True)
    spool = Spool(str(tmp_path), 1 << 20)
    assert spool.adopt() == 5
    # A second adopter in the same moment gets nothing: the first holds the lock.
    rival = Spool(str(tmp_path), 1 << 20)
    assert rival.adopt() == 0
    assert [(b.source, b.seq) for b in _drain(spool)] == [("dead:1:1", seq) for seq in range(5)]
    assert _segments(tmp_path) == []
    spool.close()
    rival.close()


def test_cap_refuses_the_newest_batch_and_keeps_the_old(tmp_path: Path) -> None:
    body = b"y" * 1000
    spool = Spool(str(tmp_path), 3500)
    accepted = [spool.append("s", seq, 10, body) for seq in range(5)]
    assert accepted == [True, True, True, False, False]
    assert spool.bytes_used() <= 3500
    assert [b.seq for b in _drain(spool)] == [0, 1, 2]
    # Acknowledged space is free again.
    assert spool.append("s", 5, 10, body)
    spool.close()


def test_cap_counts_other_processes_segments(tmp_path: Path) -> None:
    _write_in_child(tmp_path, 50, kill=False)
    used = sum(p.stat().st_size for p in _segments(tmp_path))
    spool = Spool(str(tmp_path), used + 10)
    assert not spool.append("s", 0, 1, b"z" * 100)
    spool.close()


def test_rejected_batch_is_set_aside_and_replay_goes_on(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path), 1 << 20)
    for seq in range(3):
        spool.append("s", seq, 1, b"body-%d" % seq)
    first = spool.peek()
    assert first is not None
    spool.reject(first, 422, "unknown field for kind log")
    assert [b.seq for b in _drain(spool)] == [1, 2]
    rejected = tmp_path / REJECTED_DIR
    (meta,) = rejected.glob("*.meta.json")
    assert json.loads(meta.read_text()) == {
        "source": "s",
        "seq": 0,
        "records": 1,
        "status": 422,
        "detail": "unknown field for kind log",
    }
    (body,) = rejected.glob("*.json.gz")
    assert body.read_bytes() == b"body-0"
    spool.close()


def test_stale_temp_file_is_removed(tmp_path: Path) -> None:
    stale = tmp_path / f".00000000000000000001-1-0001{SUFFIX}.tmp"
    stale.write_bytes(b"")
    spool = Spool(str(tmp_path), 1 << 20)
    spool.adopt()
    assert not stale.exists()
    spool.close()
