"""The daemon's GPU readings at the precision it sends them (agent/node/gpu/precision.py): what the
packed tier keeps in fewer bytes (collector/store/packed_params.py, ``STEPS``)."""

from __future__ import annotations

import pytest

from jobsight.agent.node.gpu import precision
from jobsight.collector.store.packed_params import STEPS


@pytest.mark.parametrize(("milliwatts", "watts"), [(0, 0.0), (100_123, 100.1), (700_050, 700.0), (700_051, 700.1),
                                                   (4_294_967_295, 4294967.3)])
def test_power_to_a_tenth_of_a_watt(milliwatts: int, watts: float) -> None:
    assert precision.watts(milliwatts) == watts


def test_energy_to_whole_joules_and_pcie_to_whole_megabytes() -> None:
    assert precision.joules(123_456_789_014) == 123_456_789.0
    assert precision.joules(1_499) == 1.0 and precision.joules(1_501) == 2.0
    assert precision.pcie_kbs(0) == 0 and precision.pcie_kbs(499) == 0 and precision.pcie_kbs(1_501) == 2_000
    assert precision.pcie_kbs(25_000_000) == 25_000_000
    assert precision.gpm_percent(70.26) == 70.3 and precision.gpm_percent(100.0) == 100.0


@pytest.mark.parametrize("milliwatts", [0, 1, 99, 100_123, 599_949, 4_294_967_295])
def test_what_is_sent_is_a_multiple_of_the_packed_step(milliwatts: int) -> None:
    """Every value the daemon sends lands on the step the packed tier divides by, so its blocks
    keep quotients, never the fine unit."""
    assert round(precision.watts(milliwatts) * 1000) % STEPS["power_w"] == 0
    assert round(precision.joules(milliwatts * 997) * 1000) % STEPS["energy_j"] == 0
    assert precision.pcie_kbs(milliwatts) % STEPS["pcie_tx_kbs"] == 0
    assert round(precision.gpm_percent(milliwatts / 1e5) * 100) % STEPS["sm_active"] == 0
