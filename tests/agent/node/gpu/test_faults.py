"""Why a GPU is slow or failing, as the node reads it: fault counters and Xid events, through the
real pynvml over the fake libnvidia-ml.so.1 (scenario ``gpu_faults``, tests/fake_nvml/README.md),
and on to the collector's tables through the node daemon.

GPU 0 is an SXM GPU with four NVLinks (one down since it counted 3 CRC errors, one without a CRC
data counter) that reports Xid 48 and then Xid 79 and falls off the bus; GPU 1 a PCIe card of the
page retirement era with no NVLink, no PCIe replay counter and no events; GPU 2 has two links, one
of which fails to give its replay counter, a failed row remap, and an application's Xids.

Every fault counter of a GPU comes from one ``nvmlDeviceGetFieldValues`` call a tick; on a driver
without it, from their own functions, NVLink's link by link, with the same answers.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobsight.agent.node.daemon import NodeDaemon
from jobsight.agent.node.gpu import field_values as nvml_fields
from jobsight.agent.node.gpu.sampler import NvmlSampler
from jobsight.agent.node.registrations import Registration, write_registration
from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.shipper import Shipper
from jobsight.protocol import wire
from jobsight.protocol.records import GpuEvent

SCENARIOS = Path(__file__).resolve().parents[3] / "fake_nvml" / "scenarios"
FAULTS = ("nvlink_crc_errors", "nvlink_replay_errors", "nvlink_recovery_errors", "pcie_replays",
          "remapped_rows_pending", "remap_failure", "retired_pages_pending")

Factory = Callable[..., NvmlSampler]


@pytest.fixture
def sampler_for(fake_library: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Factory]:
    pytest.importorskip("pynvml", reason="nvidia-ml-py (pynvml) is not installed")
    made: list[NvmlSampler] = []

    def make(scenario: Path, **options: Any) -> NvmlSampler:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(scenario))
        sampler = NvmlSampler(library_path=str(fake_library), **{"events": True, **options})
        made.append(sampler)
        return sampler

    yield make
    for sampler in made:
        sampler.close()


def _hook(library: Path, name: str, *args: Any) -> int:
    # The fake's test hooks; the library is already loaded, so this is the same copy.
    function = getattr(ctypes.CDLL(str(library)), name)
    function.restype = ctypes.c_uint
    return int(function(*args))


def calls(library: Path, function: str) -> int:
    return _hook(library, "fake_nvml_calls", function.encode())


def faults(reading: Any) -> tuple[Any, ...]:
    return tuple(getattr(reading, name) for name in FAULTS)


def without_field_values(tmp_path: Path) -> Path:
    """gpu_faults on a driver without nvmlDeviceGetFieldValues."""
    scenario = json.loads((SCENARIOS / "gpu_faults.json").read_text())
    scenario["missing"] = ["nvmlDeviceGetFieldValues"]
    path = tmp_path / "per_link.json"
    path.write_text(json.dumps(scenario))
    return path


@pytest.mark.parametrize("field_values", [True, False], ids=["field-values", "functions"])
def test_counters_follow_the_scenario(sampler_for: Factory, tmp_path: Path, field_values: bool) -> None:
    sampler = sampler_for(SCENARIOS / "gpu_faults.json" if field_values else without_field_values(tmp_path))
    ticks = [sampler.sample() for _ in range(4)]
    # GPU 0: every link counts, the one down too (its 3 CRC errors); link 3 has no CRC data counter.
    assert [faults(t[0]) for t in ticks] == [
        (4, 1, 0, 0, False, False, None),
        (7, 1, 0, 0, True, False, None),
        (10, 4, 1, 7, True, False, None),
        (None,) * 7,  # lost
    ]
    assert [t[0].lost for t in ticks] == [False, False, False, True]
    # GPU 1: no NVLink, no PCIe replay counter (missing function), no row remapping: page retirement.
    assert [faults(t[1]) for t in ticks] == [(None, None, None, None, None, None, False)] + [
        (None, None, None, None, None, None, True)] * 3
    # GPU 2: link 1's replay counter fails every tick: the replay total is unknown, the others are read.
    assert {faults(t[2]) for t in ticks} == {(4, None, 0, 1, False, True, None)}


def per_tick(sampler: NvmlSampler, library: Path, function: str, ticks: int) -> list[int]:
    """How many calls of ``function`` each of ``ticks`` samples made."""
    counts = []
    for _ in range(ticks):
        before = calls(library, function)
        sampler.sample()
        counts.append(calls(library, function) - before)
    return counts


def test_what_a_gpu_lacks_is_asked_once(sampler_for: Factory, fake_library: Path, tmp_path: Path) -> None:
    # A driver without nvmlDeviceGetFieldValues: function by function, and NVLink link by link.
    per_link = sampler_for(without_field_values(tmp_path))
    per_link.open()  # the fake counts from the scenario's loading on
    # GPU 0: 4 links x 4 counters, less link 3's CRC data counter after the first tick; GPU 2:
    # 2 links x 4 counters (link 1's replay counter fails, and is asked again each tick).
    assert per_tick(per_link, fake_library, "nvmlDeviceGetNvLinkErrorCounter", 3) == [16 + 8, 15 + 8, 15 + 8]
    per_link.sample()  # GPU 0 is lost from here
    assert calls(fake_library, "nvmlDeviceGetFieldValues") == 3  # once per GPU: missing, remembered
    # Retired pages: GPU 0 and 2 (A100 and later) say NotSupported once; GPU 1 answers every tick.
    assert calls(fake_library, "nvmlDeviceGetRetiredPagesPendingStatus") == 1 + 4 + 1
    # PCIe replays: GPU 0 three ticks (then lost), GPU 1 lacks the function (once), GPU 2 every tick.
    assert calls(fake_library, "nvmlDeviceGetPcieReplayCounter") == 3 + 1 + 4
    # Links are found once: GPU 0 asks links 0-4 (4 is past its last), GPU 2 links 0-2, and GPU 1,
    # which has no NVLink, hears NotSupported for each of the 36 links NVML can name.
    assert calls(fake_library, "nvmlDeviceGetNvLinkState") == 5 + 36 + 3
    per_link.close()

    # With it: every fault counter of a GPU in one call a tick, whatever the GPU lacks.
    sampler = sampler_for(SCENARIOS / "gpu_faults.json")
    sampler.open()
    assert per_tick(sampler, fake_library, "nvmlDeviceGetFieldValues", 4) == [3, 3, 3, 2]  # GPU 0 lost at 4
    for function in ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter", "nvmlDeviceGetPcieReplayCounter",
                     "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPagesPendingStatus"):
        assert calls(fake_library, function) == 0, function


def test_a_failing_counter_is_logged_once(sampler_for: Factory, caplog: pytest.LogCaptureFixture) -> None:
    sampler = sampler_for(SCENARIOS / "gpu_faults.json")
    with caplog.at_level(logging.DEBUG, logger="jobsight.agent.nvml"):
        for _ in range(3):
            sampler.sample()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "nvlink" in r.getMessage()]
    assert len(warnings) == 1 and "nvlink_replay_total" in warnings[0] and "Unknown" in warnings[0]


def test_xid_events_are_taken_each_tick_without_waiting(sampler_for: Factory, fake_library: Path) -> None:
    sampler = sampler_for(SCENARIOS / "gpu_faults.json")
    assert sampler.events() == []  # not open yet: nothing registered, nothing opened
    got = []
    for _ in range(4):
        sampler.sample()
        got.append([(e.gpu_index, e.code) for e in sampler.events()])
    # Each tick's Xids, earliest first; GPU 0's Xid 79 arrives with the tick it is lost after.
    assert got == [[(2, 31)], [(0, 48), (2, 13), (2, 13)], [(0, 79)], []]
    event = GpuEvent(gpu_index=2, gpu_uuid="GPU-20000000-aaaa-bbbb-cccc-000000000002", event="xid", code=31)
    record = {"kind": "gpu_event", "job": "1", "ts": wire.now_us(), **dataclasses.asdict(event)}
    wire.validate_record(record, 0)
    # One set for the node, freed with NVML.
    assert _hook(fake_library, "fake_nvml_event_sets_live") == 1
    sampler.close()
    assert _hook(fake_library, "fake_nvml_event_sets_live") == 0


def test_a_sampler_not_asked_for_events_has_no_event_set(sampler_for: Factory, fake_library: Path) -> None:
    """The in-process sampler of a training process reads the counters but ships no events: NVML
    must not queue events for a set nobody takes them from."""
    sampler = sampler_for(SCENARIOS / "gpu_faults.json", events=False)
    assert faults(sampler.sample()[2]) == (4, None, 0, 1, False, True, None)
    assert sampler.events() == []
    assert calls(fake_library, "nvmlEventSetCreate") == 0


def test_no_events_where_the_driver_has_none(sampler_for: Factory, tmp_path: Path) -> None:
    scenario = json.loads((SCENARIOS / "gpu_faults.json").read_text())
    scenario["missing"] = ["nvmlEventSetCreate"]
    path = tmp_path / "no_events.json"
    path.write_text(json.dumps(scenario))
    sampler = sampler_for(path)
    for _ in range(2):
        assert len(sampler.sample()) == 3
        assert sampler.events() == []


def test_without_faults_the_sampler_reads_what_it_read_before(sampler_for: Factory, fake_library: Path) -> None:
    sampler = sampler_for(SCENARIOS / "gpu_faults.json", faults=False, events=False)
    readings = sampler.sample()
    assert all(faults(r) == (None,) * 7 for r in readings)
    sampler.sample()
    assert sampler.events() == []
    for function in ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetPcieReplayCounter", "nvmlEventSetCreate"):
        assert calls(fake_library, function) == 0, function


def test_a_xid_becomes_a_gpu_event_of_the_gpus_job(
    live_collector: Any, db: psycopg.Connection[Any], fake_library: Path, tmp_path: Path, job_id: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node daemon, in this process, over the fake GPUs: GPU 0 works for the job, GPU 2 for
    nobody. GPU 0's Xids become the job's gpu_event rows; GPU 2's go nowhere. The samples carry
    the counters into gpu_samples."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py (pynvml) is not installed")
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(SCENARIOS / "gpu_faults.json"))
    node = f"node-{tmp_path.name}"
    empty = tmp_path / "empty"  # no /proc, no cgroups: the registration decides
    empty.mkdir()
    registrations = tmp_path / "jobs"
    write_registration(registrations, Registration(cluster="default", job_id=job_id, node=node,
                                                   started_us=wire.now_us(), gpus=(0,), user="ana"))
    settings = AgentSettings(url=live_collector.url, token=live_collector.token, node=node,
                             spool_dir=str(tmp_path / "spool"), data_dir=str(tmp_path / "data"), batch_age_s=0.2)
    sampler = NvmlSampler(library_path=str(fake_library), events=True)
    shipper = Shipper(settings)
    daemon = NodeDaemon(settings, sampler, shipper, registration_dir=str(registrations),
                        proc_root=str(empty), cgroup_root=str(empty))
    try:
        results = [daemon.tick() for _ in range(3)]
        assert shipper.flush(10.0)
    finally:
        shipper.shutdown(2.0)
        sampler.close()
    assert [(r.gpu_records, r.event_records) for r in results] == [(1, 0), (1, 1), (1, 1)]
    events = db.execute("SELECT node, gpu_index, gpu_uuid, event, code FROM gpu_events WHERE job_id = %s "
                        "ORDER BY ts", (job_id,)).fetchall()
    uuid = "GPU-00000000-aaaa-bbbb-cccc-000000000000"
    assert events == [(node, 0, uuid, "xid", 48), (node, 0, uuid, "xid", 79)]
    samples = db.execute(f"SELECT {', '.join(FAULTS)} FROM gpu_samples WHERE job_id = %s ORDER BY ts",
                         (job_id,)).fetchall()
    assert samples == [(4, 1, 0, 0, False, False, None), (7, 1, 0, 0, True, False, None),
                       (10, 4, 1, 7, True, False, None)]


def test_a_counter_nvml_cannot_give_is_no_number(sampler_for: Factory, tmp_path: Path) -> None:
    """All bits set (NVML's "not available") is no count: a bigint column cannot hold it, and the
    collector would refuse the whole batch for it."""
    scenario = json.loads((SCENARIOS / "gpu_faults.json").read_text())
    scenario["gpus"] = scenario["gpus"][2:]
    scenario["gpus"][0]["nvlink"][0]["recovery"] = 2**64 - 1
    path = tmp_path / "not_available.json"
    path.write_text(json.dumps(scenario))
    reading = sampler_for(path).sample()[0]
    assert (reading.nvlink_crc_errors, reading.nvlink_recovery_errors) == (4, None)
    wire.validate_record({"kind": "gpu_sample", "job": "1", "ts": wire.now_us(), **reading.to_record()}, 0)


@pytest.mark.parametrize(
    ("value_type", "raw", "value"),
    [
        (3, 2**64 - 1, 2**64 - 1),  # unsigned long long: all 8 bytes
        (2, 5, 5),  # unsigned long: 8 bytes on Linux
        (1, (0xDEAD << 32) | 7, 7),  # unsigned int: NVML wrote 4 bytes, the other 4 are left over
        (6, 0xFFFF_0003, 3),  # unsigned short
        (5, 0xFFFF_FFFF, -1),  # signed int
        (4, 2**64 - 2, -2),  # signed long long
        (0, int.from_bytes(struct.pack("<d", 12.0), "little"), 12),  # double
        (0, int.from_bytes(struct.pack("<d", float("nan")), "little"), None),
    ],
)
def test_a_field_value_is_read_by_its_type(value_type: int, raw: int, value: int | None) -> None:
    assert nvml_fields.decode(value_type, raw) == value
