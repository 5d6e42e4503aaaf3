"""What the bench's GPU samples carry: an estimate of the bytes any exact codec must spend.

For each column, at the precision it was sent and the packed tier keeps it (whole percents and
degrees, MHz, bytes; the node daemon's 0.1 W, whole J, whole MB/s and tenths of a GPM point: a
column's unit does not change its entropy, only its values do), the order-0 entropy of its values and of its
first differences along each GPU's series, whichever is smaller: a delta (or plain) coder with
an ideal entropy coder reaches about that, a context model can beat it on smooth series but not
on the workload's white noise. Sample times count once per node tick (the GPUs of a node share
them), as their second differences in microseconds. NULL is a symbol like any value.

It sets the packed tier's figure against what is possible: columns that are uniform noise
(PCIe throughput, the GPM ratios, power's jitter) cost their entropy whatever the format.
"""

from __future__ import annotations

from typing import Any, Final

import psycopg

COLUMNS: Final = {
    "util_gpu": "round(util_gpu)::int8", "util_mem": "round(util_mem)::int8", "mem_used": "mem_used",
    "mem_total": "mem_total", "power_w": "round(power_w * 1000)::int8", "energy_j": "round(energy_j * 1000)::int8",
    "temp_c": "round(temp_c)::int8", "sm_clock_mhz": "sm_clock_mhz::int8", "mem_clock_mhz": "mem_clock_mhz::int8",
    "pcie_tx_kbs": "pcie_tx_kbs::int8", "pcie_rx_kbs": "pcie_rx_kbs::int8", "throttle_reasons": "throttle_reasons",
    "ecc_errors": "ecc_errors", "process_count": "process_count::int8", "sm_active": "round(sm_active * 100)::int8",
    "tensor_active": "round(tensor_active * 100)::int8", "lost": "lost::int4::int8",
}
"""Each measured column as an integer at the precision kept."""

_ENTROPY: Final = """
SELECT coalesce(-sum(n / t * ln(n / t)) / ln(2), 0) AS bits
FROM (SELECT count(*)::float8 AS n, sum(count(*)) OVER ()::float8 AS t FROM {table} GROUP BY {column}) x
"""

_TICKS: Final = """
CREATE TEMP TABLE entropy_ticks AS
SELECT us - 2 * lag(us) OVER w + lag(us, 2) OVER w AS dd
FROM (SELECT node, (extract(epoch FROM ts) * 1e6)::int8 AS us FROM gpu_samples WHERE gpu_index = 0) s
WINDOW w AS (PARTITION BY node ORDER BY us)
"""


def _bits(conn: psycopg.Connection[Any], table: str, column: str) -> float:
    row = conn.execute(_ENTROPY.format(table=table, column=column)).fetchone()
    assert row is not None
    return float(row["bits"])


def entropy_floor(conn: psycopg.Connection[Any], gpus_per_node: int = 8) -> tuple[float, dict[str, float]]:
    """(bytes per GPU sample in all, bytes per column) over the raw ``gpu_samples`` of the database."""
    values = ", ".join(f"{expression} AS {name}" for name, expression in COLUMNS.items())
    deltas = ", ".join(f"{name} - lag({name}) OVER w AS {name}" for name in COLUMNS)
    conn.execute(f"CREATE TEMP TABLE entropy_values AS SELECT node, gpu_index, ts, {values} FROM gpu_samples")
    conn.execute(f"""CREATE TEMP TABLE entropy_deltas AS SELECT {deltas} FROM entropy_values
                     WINDOW w AS (PARTITION BY node, gpu_index ORDER BY ts)""")
    conn.execute(_TICKS)
    try:
        per_column = {name: min(_bits(conn, "entropy_values", name), _bits(conn, "entropy_deltas", name)) / 8
                      for name in COLUMNS}
        per_column = {"sample_ts": _bits(conn, "entropy_ticks", "dd") / 8 / gpus_per_node, **per_column}
    finally:
        conn.execute("DROP TABLE entropy_values, entropy_deltas, entropy_ticks")
    return sum(per_column.values()), per_column
