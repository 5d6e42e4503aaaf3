"""The clock event (throttle) reasons bit mask, as names: the bits are NVML's own."""

from __future__ import annotations

import pytest

from jobsight.protocol import throttle


def test_the_bits_are_nvmls() -> None:
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py (pynvml) is not installed")
    nvml_names = {
        "gpu_idle": "GpuIdle", "applications_clocks": "ApplicationsClocksSetting", "sw_power_cap": "SwPowerCap",
        "hw_slowdown": "HwSlowdown", "sync_boost": "SyncBoost", "sw_thermal_slowdown": "SwThermalSlowdown",
        "hw_thermal_slowdown": "HwThermalSlowdown", "hw_power_brake": "HwPowerBrakeSlowdown",
        "display_clock": "DisplayClockSetting", "board_limit": "BoardLimit", "reliability": "Reliability",
    }
    assert [r.name for r in throttle.REASONS] == list(nvml_names)
    for reason in throttle.REASONS:
        assert getattr(pynvml, f"nvmlClocksThrottleReason{nvml_names[reason.name]}") == reason.bit, reason
    assert sum(r.bit for r in throttle.REASONS) == pynvml.nvmlClocksThrottleReasonAll


def test_a_mask_reads_as_names_lowest_bit_first() -> None:
    assert throttle.names(None) == [] and throttle.names(0) == []
    assert throttle.names(0x4 | 0x40 | 0x1) == ["gpu_idle", "sw_power_cap", "hw_thermal_slowdown"]
    assert throttle.labels(0x20 | 0x40) == ["thermal slowdown (software)", "thermal slowdown (hardware)"]
    # A bit a later driver adds is kept, by its value.
    assert throttle.names(0x8 | 0x1000) == ["hw_slowdown", "unknown_0x1000"]
    # An int8 column gives back the top bit as a negative number.
    assert throttle.names(-(2**63)) == ["unknown_0x8000000000000000"]


def test_only_what_holds_back_a_busy_gpu_is_a_slowdown() -> None:
    every = sum(r.bit for r in throttle.REASONS)
    assert [r.name for r in throttle.slowdowns(every)] == [
        "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake",
        "board_limit", "reliability",
    ]
    assert throttle.slowdowns(throttle.GPU_IDLE.bit | throttle.SYNC_BOOST.bit | throttle.APPLICATIONS_CLOCKS.bit) == []
    assert throttle.SLOWDOWN_MASK == sum(r.bit for r in throttle.slowdowns(every))
