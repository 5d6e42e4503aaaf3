"""How a job's whole energy and emissions read, in the report, the e-mails and the job page."""

from __future__ import annotations

from typing import Any, Final

from jobsight.rules import display_text

POWER_SOURCES: Final = {
    "rapl": "RAPL (CPU packages and DRAM)",
    "ipmi": "IPMI DCMI (the whole node, less its GPUs)",
    "redfish": "Redfish (the whole node, less its GPUs)",
}
ENERGY_SPLITS: Final = {
    "cpu_time+idle_cores": "by CPU time, idle power by allocated cores",
    "cpu_time": "by CPU time, idle power unassigned",
}
NO_NODE_SOURCE: Final = "GPUs only: no node power source on its nodes"


def figure(value: float) -> str:
    """Five significant digits, trailing zeros kept (:func:`jobsight.rules.display_text.figure`)."""
    return display_text.figure(value)


def kwh(value: float | None) -> str:
    return display_text.energy(value)


def co2e(value: float | None) -> str:
    return display_text.co2e(value)


def node_method(node: dict[str, Any] | None) -> str:
    """The node part's sources and split in words, and how much of the job they covered."""
    node = node or {}
    sources = [POWER_SOURCES.get(s, s) for s in node.get("sources") or []]
    if not sources:
        return NO_NODE_SOURCE
    splits = [ENERGY_SPLITS.get(s, s) for s in node.get("splits") or []]
    samples, measured = node.get("samples") or 0, node.get("measured") or 0
    coverage = f"; {measured} of {samples} host samples measured" if samples and measured < samples else ""
    return f"{', '.join(sources)}; split {', '.join(splits) or display_text.MISSING}{coverage}"


def emissions_method(emissions: dict[str, Any] | None) -> str:
    """The factors of an emissions figure in words."""
    if not emissions or emissions.get("co2e_kg") is None:
        return (emissions or {}).get("reason") or "no carbon intensity configured"
    return (f"PUE {emissions['pue']:.2f} x {emissions['intensity_g_per_kwh']:.1f} g CO2e/kWh "
            f"({'; '.join(emissions.get('intensity_sources') or [])})")


def energy_rows(energy: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of the whole job's energy (``GET /v1/jobs/{job}/energy``'s answer)."""
    emissions = energy.get("emissions") or {}
    return [
        ("Energy", kwh(energy.get("total_kwh"))),
        ("GPU energy", kwh(energy.get("gpu_kwh"))),
        ("Node energy", kwh(energy.get("node_kwh")) + f" ({node_method(energy.get('node'))})"),
        ("Emissions", co2e(emissions.get("co2e_kg")) + f" ({emissions_method(energy.get('emissions'))})"),
    ]
