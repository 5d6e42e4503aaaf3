"""The simulated GPUs of the demo: NVML's reader interface, readings that follow the load, and 16 of
them shipped by the real node daemon and shipper to a real collector."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobsight.agent.node.daemon import NodeDaemon
from jobsight.agent.node.gpu.sampler import NvmlSampler
from jobsight.agent.node.gpu.simulated import (
    IDLE_W,
    REASON_GPU_IDLE,
    REASON_HW_THERMAL,
    SM_CLOCK_THROTTLED_MHZ,
    TDP_W,
    GiB,
    GpuLoad,
    SimulatedGpus,
)
from jobsight.agent.node.registrations import Registration, write_registration
from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.shipper import Shipper
from jobsight.protocol.wire import now_us, validate_record


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_it_has_the_nvml_samplers_interface() -> None:
    """Whatever reads NvmlSampler (the daemon, the in-process sampler) can read these instead."""
    public = [name for name, _ in inspect.getmembers(NvmlSampler, inspect.isfunction)
              if not name.startswith("_") or name in ("__enter__", "__exit__")]
    assert {"open", "close", "sample", "visible_gpu_indices"} <= set(public)
    for name in public:
        ours = getattr(SimulatedGpus, name, None)
        assert ours is not None, name
        theirs = getattr(NvmlSampler, name)
        assert list(inspect.signature(ours).parameters) == list(inspect.signature(theirs).parameters), name
    gpus = SimulatedGpus("sim-a")
    assert hasattr(gpus, "driver_version")
    with gpus as opened:
        assert opened is gpus


def test_readings_follow_the_load_and_pass_the_wire_checks() -> None:
    clock = Clock()
    gpus = SimulatedGpus("sim-a", 8, clock=clock, seed=1)
    held = 60 * GiB
    gpus.set_load(0, GpuLoad(util=90.0, mem_used=held, pids=(4000,)))
    gpus.set_load(1, GpuLoad(util=99.0, mem_used=held, pids=(4001,), throttled=True))
    gpus.set_load(2, GpuLoad(util=0.0, mem_used=held, pids=(4002,)))  # hung: idle, memory still held
    powers: list[float] = []
    energies: list[float] = []
    for _ in range(30):
        readings = gpus.sample()
        assert len(readings) == 8
        for reading in readings:
            record = {"kind": "gpu_sample", "job": "j", "ts": now_us(), "node": "sim-a", **reading.to_record()}
            validate_record(record, 0)
        powers.append(readings[0].power_w or 0.0)
        energies.append(readings[0].energy_j or 0.0)
        clock.t += 1.0
    busy, throttled, hung, unused = gpus.sample()[:4]
    assert 75 <= (busy.util_gpu or 0) <= 100 and IDLE_W < (busy.power_w or 0) <= TDP_W
    assert busy.processes == [(4000, held)] and busy.process_count == 1 and (busy.mem_used or 0) >= held
    assert throttled.sm_clock_mhz == SM_CLOCK_THROTTLED_MHZ and (throttled.throttle_reasons or 0) & REASON_HW_THERMAL
    assert (throttled.temp_c or 0) > (busy.temp_c or 0)
    assert (hung.util_gpu or 0) < 2 and hung.throttle_reasons == REASON_GPU_IDLE and (hung.mem_used or 0) >= held
    assert unused.process_count == 0 and (unused.util_gpu or 0) < 2
    assert "simulated" in (busy.gpu_name or "")
    # The energy counter integrates the power it reports, as NVML's does (1 s between readings).
    steps = [b - a for a, b in zip(energies, energies[1:], strict=False)]
    expected = [(a + b) / 2 for a, b in zip(powers, powers[1:], strict=False)]
    assert steps == pytest.approx(expected, abs=1.1)  # each end sent as whole J (precision.py)


def test_visible_devices_map_as_nvmls_do() -> None:
    gpus = SimulatedGpus("sim-a", 8)
    uuid_of_2 = gpus.sample([2])[0].gpu_uuid
    assert gpus.visible_gpu_indices(None) == list(range(8))
    assert gpus.visible_gpu_indices("3,1") == [3, 1]
    assert gpus.visible_gpu_indices(uuid_of_2[:12]) == [2]
    assert [r.gpu_index for r in gpus.sample({5, 6})] == [5, 6]
    # The same node's GPUs keep their UUIDs across runs; another node's differ.
    assert SimulatedGpus("sim-a", 8).sample([2])[0].gpu_uuid == uuid_of_2
    assert SimulatedGpus("sim-b", 8).sample([2])[0].gpu_uuid != uuid_of_2


def test_sixteen_simulated_gpus_ship_through_the_real_node_daemon(
    live_collector: Any, db: psycopg.Connection[Any], tmp_path: Path, job_id: str
) -> None:
    """Two nodes of 8: the node daemon attributes them by the registrations and ships them with
    the one collector client, exactly as it does NVML's readings."""
    empty = tmp_path / "empty"  # no /proc, no cgroups: the registrations decide
    empty.mkdir()
    for n, node in enumerate((f"{job_id}-n1", f"{job_id}-n2")):
        gpus = SimulatedGpus(node, 8, seed=n)
        for index in range(8):
            gpus.set_load(index, GpuLoad(util=90.0, mem_used=40 * GiB, pids=(50_000 + 8 * n + index,)))
        registrations = tmp_path / node / "jobs"
        write_registration(registrations, Registration(cluster="default", job_id=job_id, node=node,
                                                       started_us=now_us(), gpus=tuple(range(8)), user="ana"))
        settings = AgentSettings(url=live_collector.url, token=live_collector.token, node=node,
                                 spool_dir=str(tmp_path / node / "spool"), data_dir=str(tmp_path / "data"),
                                 batch_age_s=0.2)
        shipper = Shipper(settings)
        daemon = NodeDaemon(settings, gpus, shipper, registration_dir=str(registrations),  # type: ignore[arg-type]
                            proc_root=str(empty), cgroup_root=str(empty))
        try:
            assert [daemon.tick().gpu_records for _ in range(2)] == [8, 8]
            assert shipper.flush(10.0)
        finally:
            shipper.shutdown(2.0)
    rows = db.execute(
        "SELECT node, gpu_index, count(*), min(util_gpu), max(energy_j) - min(energy_j), min(gpu_name) "
        "FROM gpu_samples WHERE job_id = %s GROUP BY node, gpu_index", (job_id,)).fetchall()
    assert len(rows) == 16
    for _node, _index, samples, util, energy, name in rows:
        assert samples == 2 and util > 70 and energy >= 0 and name.endswith("(simulated)")
