"""The precision the node daemon sends GPU readings at: what the sensor can tell, no finer.

NVML reports in units finer than its sensors resolve, and every digit below what a reading can
tell is noise that costs the collector bytes for as long as the job is kept (a digit of noise is
about half a byte per sample once packed). So the daemon rounds, once, where it reads:

* power to 0.1 W: NVML's mW, from a sensor accurate to a few watts;
* the energy counter to whole J: NVML's mJ; a job's energy is the counter's difference, so each
  end is off by half a joule at most, not each sample;
* PCIe throughput to whole MB/s (still sent in KB/s): NVML measures it over 20 ms of each
  second, and shows MB/s itself (``nvidia-smi dmon``);
* the GPM ratios (SM and tensor activity) to a tenth of a point: doubles computed from two
  samples a second apart.

Utilisation, temperature, clocks and memory come as integers already.
"""

from __future__ import annotations


def watts(milliwatts: int | float) -> float:
    """NVML's power in mW as W, to 0.1 W."""
    return round(float(milliwatts) / 100.0) / 10.0


def joules(millijoules: int | float) -> float:
    """NVML's energy counter in mJ as whole J."""
    return float(round(float(millijoules) / 1000.0))


def pcie_kbs(kbs: int) -> int:
    """NVML's PCIe throughput in KB/s, to whole MB/s."""
    return round(kbs / 1000) * 1000


def gpm_percent(percent: float) -> float:
    """A GPM ratio in percent, to a tenth of a point."""
    return round(percent, 1)
