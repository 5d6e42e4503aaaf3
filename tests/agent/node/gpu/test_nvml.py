"""agent/node/gpu/ (the NVML door and the sampler) against the real pynvml binding over the fake libnvidia-ml.so.1.

NVML state is process-global, so every test closes its sampler (the fixture does
it); the fake reads $FAKE_NVML_SCENARIO again at the next first nvmlInit.
"""

from __future__ import annotations

import ctypes
import importlib.util
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobsight.agent.node.gpu.nvml import NvmlUnavailable
from jobsight.agent.node.gpu.reading import GpuReading, visible_gpu_indices
from jobsight.agent.node.gpu.sampler import NvmlSampler
from jobsight.protocol import wire

ROOT = Path(__file__).resolve().parents[4]
FAKE_DIR = ROOT / "tests" / "fake_nvml"
SCENARIOS = FAKE_DIR / "scenarios"
GiB = 1024**3

Factory = Callable[[str], NvmlSampler]


def _load_build_module() -> object:
    spec = importlib.util.spec_from_file_location("fake_nvml_build", FAKE_DIR / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fake_library() -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found: cannot build the fake libnvidia-ml.so.1")
    pytest.importorskip("pynvml", reason="nvidia-ml-py (pynvml) is not installed")
    path: Path = _load_build_module().build_fake_nvml()  # type: ignore[attr-defined]
    return path


@pytest.fixture
def sampler_for(fake_library: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Factory]:
    """Make a sampler over the fake library with the named scenario."""
    made: list[NvmlSampler] = []

    def make(scenario: str) -> NvmlSampler:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(SCENARIOS / f"{scenario}.json"))
        sampler = NvmlSampler(library_path=str(fake_library))
        made.append(sampler)
        return sampler

    yield make
    for sampler in made:
        sampler.close()


def _device_calls(library: Path, index: int) -> int:
    # A test hook the fake exports; the library is already loaded, so this is the same copy.
    lib = ctypes.CDLL(str(library))
    lib.fake_nvml_device_calls.restype = ctypes.c_uint
    return int(lib.fake_nvml_device_calls(ctypes.c_uint(index)))


def _gpm_samples_live(library: Path) -> int:
    lib = ctypes.CDLL(str(library))
    lib.fake_nvml_gpm_samples_live.restype = ctypes.c_uint
    return int(lib.fake_nvml_gpm_samples_live())


def test_four_gpus_read_back_exactly(sampler_for: Factory) -> None:
    sampler = sampler_for("four_gpus")
    readings = sampler.sample()
    assert sampler.driver_version == "550.54.15"
    assert [r.gpu_index for r in readings] == [0, 1, 2, 3]
    r2 = readings[2]
    assert r2 == GpuReading(
        gpu_index=2,
        gpu_uuid="GPU-20000000-aaaa-bbbb-cccc-000000000002",
        gpu_name="NVIDIA H100 80GB HBM3",
        mig_uuid=None,
        util_gpu=30.0,
        util_mem=15.0,
        mem_used=30 * GiB,
        mem_total=85520809984,
        power_w=200.1,  # 200123 mW, sent to 0.1 W (agent/node/gpu/precision.py)
        energy_j=123456789.0,  # mJ, sent as whole J
        temp_c=42.0,
        sm_clock_mhz=1978,
        mem_clock_mhz=2619,
        pcie_tx_kbs=3000,
        pcie_rx_kbs=6000,
        throttle_reasons=4,
        ecc_errors=2,
        process_count=1,
        sm_active=None,  # no gpm_* keys: the GPU says GPM is unsupported
        tensor_active=None,
        lost=False,
        processes=[(1002, 3 * GiB)],
    )
    for i, r in enumerate(readings):
        assert r.gpu_uuid == f"GPU-{i}0000000-aaaa-bbbb-cccc-00000000000{i}"
        assert r.power_w == pytest.approx(100.1 + 50 * i)
        assert r.mem_used == (i + 1) * 10 * GiB
        assert r.temp_c == 40.0 + i
        assert not r.lost
    assert readings[1].processes == [(2001, 3 * GiB), (2002, 4 * GiB)]
    assert readings[1].process_count == 2
    assert readings[3].processes == [] and readings[3].process_count == 0


def test_values_follow_the_scenario_over_ticks(sampler_for: Factory) -> None:
    sampler = sampler_for("four_gpus")
    ticks = [sampler.sample() for _ in range(4)]
    assert [t[1].util_gpu for t in ticks] == [
        11.0,
        22.0,
        33.0,
        33.0,
    ]  # last value holds
    assert [t[0].util_gpu for t in ticks] == [10.0] * 4


def test_scenario_is_reread_after_close(sampler_for: Factory) -> None:
    first = sampler_for("four_gpus")
    assert len(first.sample()) == 4
    first.close()
    second = sampler_for("power_not_supported")
    assert len(second.sample()) == 3


def test_to_record_is_a_valid_gpu_sample(sampler_for: Factory) -> None:
    reading = sampler_for("four_gpus").sample()[1]
    record = reading.to_record()
    assert set(record) == set(wire.FIELDS["gpu_sample"])
    assert "processes" not in record
    full = {
        "kind": "gpu_sample",
        "job": "123",
        "ts": wire.now_us(),
        "node": "n1",
        **record,
    }
    wire.validate_record(full, 0)


def test_power_not_supported_loses_only_that_field(sampler_for: Factory) -> None:
    good, bad, other = sampler_for("power_not_supported").sample()
    assert bad.power_w is None
    assert bad.energy_j == 123456789.0
    assert bad.util_gpu == 20.0 and bad.temp_c == 41.0 and bad.mem_used == 20 * GiB
    assert good.power_w == 100.1 and other.power_w == 200.1
    assert not bad.lost


def test_missing_function_gives_null_field(sampler_for: Factory) -> None:
    readings = sampler_for("function_missing").sample()
    for r in readings:
        assert r.energy_j is None
        assert r.power_w is not None
        # nvmlDeviceGetCurrentClocksEventReasons is missing: the older throttle call answers.
        assert r.throttle_reasons == [0, 1][r.gpu_index]
        assert r.sm_active is None  # nvmlGpmQueryDeviceSupport is missing


def test_gpu_lost_mid_run(sampler_for: Factory, fake_library: Path) -> None:
    sampler = sampler_for("gpu_lost")
    tick1 = sampler.sample()
    assert [r.lost for r in tick1] == [False, False, False]
    assert tick1[1].util_gpu == 20.0

    tick2 = sampler.sample()
    assert [r.lost for r in tick2] == [False, True, False]
    lost = tick2[1]
    assert lost.gpu_index == 1 and lost.gpu_uuid == tick1[1].gpu_uuid
    measured = {k: v for k, v in lost.to_record().items() if k not in ("gpu_index", "gpu_uuid", "gpu_name", "lost")}
    assert all(v is None for v in measured.values()), measured
    assert tick2[0].util_gpu == 10.0 and tick2[2].power_w == 200.1

    calls = _device_calls(fake_library, 1)
    tick3 = sampler.sample()
    assert [r.lost for r in tick3] == [False, True, False]
    assert _device_calls(fake_library, 1) == calls  # not asked again


def test_mig_devices_are_rows_of_their_own(sampler_for: Factory) -> None:
    readings = sampler_for("mig").sample()
    assert [(r.gpu_index, r.mig_uuid) for r in readings] == [
        (0, None),
        (0, "MIG-11111111-2222-3333-4444-555555555555"),
        (0, "MIG-66666666-7777-8888-9999-000000000000"),
        (1, None),
    ]
    parent, mig1, mig2, plain = readings
    assert parent.util_gpu is None  # a GPU in MIG mode reports no utilisation
    assert parent.power_w == 100.1 and parent.mem_total == 85520809984
    assert mig1.gpu_uuid == parent.gpu_uuid and mig1.gpu_name == "NVIDIA A100-SXM4-80GB"
    assert (mig1.mem_used, mig1.mem_total) == (1 * GiB, 10 * GiB)
    assert mig1.processes == [(4242, 512 * 1024**2)] and mig1.process_count == 1
    assert (mig2.mem_used, mig2.mem_total, mig2.process_count) == (2 * GiB, 20 * GiB, 0)
    assert mig1.power_w is None and mig1.temp_c is None
    assert plain.mig_uuid is None and plain.util_gpu == 20.0


def test_library_absent_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "libnvidia-ml.so.1"
    sampler = NvmlSampler(library_path=str(missing))
    with pytest.raises(NvmlUnavailable) as info:
        sampler.sample()
    message = str(info.value)
    assert str(missing) in message and "cannot load the NVML library" in message
    assert "\n" not in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_init_failure_is_a_clear_error(sampler_for: Factory) -> None:
    sampler = sampler_for("init_fails")
    with pytest.raises(NvmlUnavailable, match="driver is not loaded"):
        sampler.open()


def test_visible_gpus_through_nvml(sampler_for: Factory) -> None:
    four = sampler_for("four_gpus")
    assert four.visible_gpu_indices(None) == [0, 1, 2, 3]
    assert four.visible_gpu_indices("2,GPU-00000000-aaaa-bbbb-cccc-000000000000") == [
        2,
        0,
    ]
    assert four.visible_gpu_indices("GPU-3") == [3]  # a unique prefix is enough
    readings = four.sample(four.visible_gpu_indices("3,1"))
    assert [r.gpu_index for r in readings] == [1, 3]
    four.close()
    mig = sampler_for("mig")
    assert mig.visible_gpu_indices("MIG-66666666-7777-8888-9999-000000000000") == [0]


def test_visible_gpu_mapping_rules() -> None:
    devices = [
        (0, "GPU-aaaa-0000", ["MIG-1111", "MIG-2222"]),
        (1, "GPU-aaab-1111", []),
        (3, "GPU-cccc-3333", []),  # index 2 is hidden (say, by a cgroup)
    ]
    assert visible_gpu_indices(None, devices) == [0, 1, 3]
    assert visible_gpu_indices("", devices) == []
    assert visible_gpu_indices("1, 0", devices) == [1, 0]
    assert visible_gpu_indices("0,0,1", devices) == [0, 1]
    assert visible_gpu_indices("GPU-cccc", devices) == [3]
    assert visible_gpu_indices("GPU-aaa", devices) == []  # ambiguous prefix names no device
    assert visible_gpu_indices("MIG-2222", devices) == [0]
    assert visible_gpu_indices("MIG-GPU-aaab-1111/1/0", devices) == [1]
    assert visible_gpu_indices("1,2,0", devices) == [1]  # CUDA stops at the first bad entry
    assert visible_gpu_indices("-1", devices) == []


def test_import_does_not_need_pynvml() -> None:
    code = "import sys, jobsight.agent.node.gpu.sampler; assert 'pynvml' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_gpu_lost_before_start_and_transient_errors(sampler_for: Factory, caplog: pytest.LogCaptureFixture) -> None:
    sampler = sampler_for("faults")
    with caplog.at_level("WARNING", logger="jobsight.agent.nvml"):
        first = sampler.sample()
        second = sampler.sample()
    lost, flaky = first
    # GPU 0 fell off the bus before the sampler started: no handle, so no UUID either.
    assert lost.lost and lost.gpu_index == 0 and lost.gpu_uuid == ""
    assert lost.util_gpu is None
    # An unknown error loses the field for that tick only, and is logged once.
    assert flaky.temp_c is None and flaky.pcie_rx_kbs is None
    assert flaky.pcie_tx_kbs == 2000 and flaky.util_gpu == 20.0 and not flaky.lost
    assert second[1].temp_c is None and second[0].lost
    temp_warnings = [r for r in caplog.records if "temperature" in r.getMessage()]
    assert len(temp_warnings) == 1


def test_malformed_scenario_fails_init(fake_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Generated here rather than kept in scenarios/, so the folder holds only valid JSON.
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpus": [{"uuid": "GPU-1", }]}')
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(bad))
    sampler = NvmlSampler(library_path=str(fake_library))
    with pytest.raises(NvmlUnavailable, match="NVML could not be initialised"):
        sampler.open()
    sampler.close()


def test_gpm_activity_between_ticks(sampler_for: Factory, fake_library: Path) -> None:
    sampler = sampler_for("gpm")
    ticks = [sampler.sample() for _ in range(4)]
    # The first tick has no interval yet; then each tick reads the values at its own tick.
    assert [t[0].sm_active for t in ticks] == [None, 60.0, 70.5, 70.5]
    assert [t[0].tensor_active for t in ticks] == [None, 20.0, 30.2, 30.2]  # 30.25 to a tenth
    assert all(t[1].sm_active is None and t[1].tensor_active is None for t in ticks)  # no GPM there
    assert [t[2].sm_active for t in ticks] == [None, 2.0, None, None]
    assert [t[2].lost for t in ticks] == [False, False, True, True]
    assert _gpm_samples_live(fake_library) == 1  # GPU 0's previous sample; the lost GPU's was freed
    sampler.close()
    assert _gpm_samples_live(fake_library) == 0
