"""The packed tier's encoder: the SQL that packs ``gpu_samples`` and ``host_samples`` columns into
their blocks (``gpu_sample_blocks``, ``host_sample_blocks``) and reads them back.

The format is specified in ``docs/format/packed.md``; its numbers (planes per column, scales,
steps, counters, the device dictionary) are in :mod:`jobsight.collector.store.packed_params`. Here
each column gets an :class:`Encoding`: the SQL that packs it from the samples of a block (used by
:mod:`jobsight.collector.tiers.compaction` and :mod:`jobsight.collector.tiers.host_tier`) and the
SQL expression that gives the value back from the unnested elements (used by
:mod:`jobsight.collector.tiers.reads` and by the merge of late samples). :data:`ENCODINGS` and
:data:`HOST_ENCODINGS` say which columns are byte planes of integers, scaled floats, a counter or
plain arrays, and name the arrays of blocks packed before migration 0015 (``legacy``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from jobsight.collector.store.packed_params import (
    BYTE_OFFSET,
    BYTE_TYPE,
    COUNTER_SPAN,
    DIFFERENCE_PLANES,
    HOST_PLANES,
    HOST_SCALES,
    PLANES,
    SCALES,
    SPAN_GUARD,
    STEPS,
    Scale,
)
from jobsight.collector.store.schema import SERIES_KEY, host_samples

ORDER: Final = (
    "s.ts, s.util_gpu, s.util_mem, s.mem_used, s.mem_total, s.power_w, s.energy_j, s.temp_c, s.sm_clock_mhz, "
    "s.mem_clock_mhz, s.pcie_tx_kbs, s.pcie_rx_kbs, s.throttle_reasons, s.ecc_errors, s.process_count, "
    "s.sm_active, s.tensor_active, s.lost, s.nvlink_crc_errors, s.nvlink_replay_errors, s.nvlink_recovery_errors, "
    "s.pcie_replays, s.remapped_rows_pending, s.remap_failure, s.retired_pages_pending"
)
"""The order of a block's samples: time, then the values, so that samples sharing a time are in
the same order in every array (each ``array_agg`` sorts on its own unless the planner shares the
sort) and a block packs to the same bytes however its rows were stored."""

_ENERGY: Final = SCALES["energy_j"]
ENERGY_MJ: Final = f"CASE WHEN abs(s.energy_j) < {_ENERGY.bound} THEN round(s.energy_j * {_ENERGY.scale}) END"
"""A sample's energy in whole mJ (float8). Under 4e12 J the mJ stay under 2^53, where float8
holds every integer."""


@dataclass(frozen=True)
class Layout:
    """What the encodings of one packed table share: ``order``, the SQL order of a block's samples
    (over the sample ``s``); ``planes``, the byte planes of each column kept in planes; ``scales``,
    how its float columns become integers; ``steps``, the steps its columns may be divided by."""

    order: str
    planes: Mapping[str, int]
    scales: Mapping[str, Scale] = field(default_factory=dict)
    steps: Mapping[str, int] = field(default_factory=dict)


GPU: Final = Layout(ORDER, PLANES, SCALES, STEPS)


@dataclass(frozen=True)
class Encoding:
    """One measurement column of a raw table in its blocks (``gpu_samples`` in
    ``gpu_sample_blocks``, ``host_samples`` in ``host_sample_blocks``).

    Packing, in four steps of the compaction pass: ``integer`` is the SQL giving a sample's value
    as the integer its planes hold (over the sample ``s``; NULL where it has none), computed once
    per sample as ``i_<column>``; ``window`` what is known of the block's integers (over the window
    ``g`` of the block: its least value ``lo_<column>``...); ``aggregates`` the block's
    ``(name, SQL)`` over its samples ``s``; ``stored`` the block columns written and ``packed``
    their SQL over the aggregated block ``p``. To read it: ``arrays`` are the array columns to
    unnest, ``carried`` the block's other columns it needs (``<SQL over the block b> AS
    b_<name>``), and ``decode`` the SQL giving the value back from the elements, named
    ``u_<array>``, and the carried ``b_<name>``. ``legacy`` are the columns only blocks packed
    before migration 0015 have."""

    column: str
    integer: str | None
    window: tuple[str, ...]
    aggregates: tuple[tuple[str, str], ...]
    stored: tuple[str, ...]
    packed: tuple[str, ...]
    arrays: tuple[str, ...]
    carried: tuple[str, ...]
    decode: str
    legacy: tuple[str, ...] = ()
    computed: tuple[str, ...] = ()
    """Select-list items ``unnest(<array SQL over the block b>) AS u_<name>``, beside ``arrays``."""


def _ordered(expression: str, layout: Layout) -> str:
    return f"array_agg({expression} ORDER BY {layout.order})"


def _unless_all_null(column: str, aggregate: str) -> str:
    return f"CASE WHEN count(s.{column}) > 0 THEN {aggregate} END"


def _plain(column: str, layout: Layout = GPU) -> Encoding:
    return Encoding(
        column=column,
        integer=None,
        window=(),
        aggregates=((column, _unless_all_null(column, _ordered(f"s.{column}", layout))),),
        stored=(column,),
        packed=(f"p.{column}",),
        arrays=(column,),
        carried=(),
        decode=f"u_{column}",
    )


def _plane_names(column: str, layout: Layout) -> list[str]:
    return [f"{column}_p{k}" for k in range(layout.planes[column])]


def _block_window(column: str, step: int | None = None, counter: bool = False) -> tuple[str, ...]:
    """What the pass knows of a block's integers before it packs them, over the window ``g`` of
    the block: the least (the base), the bits that vary (OR # AND: a byte is the same in every
    value where they agree, so its plane would be zeros), and whether no value is NULL. With a
    ``step``: whether every value is a multiple of it, and the bits that vary in the quotients. A
    ``counter``: its greatest, its first and each sample's previous value (for the differences)."""
    i = f"s.i_{column}"
    window: tuple[str, ...] = (
        f"min({i}) OVER g AS lo_{column}", f"bit_or({i}) OVER g # bit_and({i}) OVER g AS var_{column}",
        f"count(s.{column}) OVER g = count(*) OVER g AS full_{column}")
    if counter:
        window = (*window, f"max({i}) OVER g AS hi_{column}", f"first_value({i}) OVER g AS f_{column}",
                  f"lag({i}) OVER g AS pv_{column}")
    if step is None:
        return window
    q = f"({i} / {step})"
    return (*window, f"coalesce(bool_and(mod({i}, {step}) = 0) OVER g, false) AS by_{column}",
            f"bit_or({q}) OVER g # bit_and({q}) OVER g AS qvar_{column}")


_Packing = tuple[tuple[tuple[str, str], ...], tuple[str, ...], tuple[str, ...]]
"""(aggregates, stored, packed) of a column: the parts of :class:`Encoding` that pack it."""


def _planes(column: str, exact: str, layout: Layout, step: int | None = None, counter: bool = False) -> _Packing:
    """(aggregates, stored, packed) of a column's byte planes, when the block's ``exact`` (SQL) holds.

    The block's values XOR its base are aggregated once, in the order every array has (one sort
    serves them all); each plane needed is cut from that array: plane k of a sample is byte k,
    shifted to ``"char"``'s -128..127. (Aggregating each plane apart would build every plane of
    every column, as an aggregate in a CASE is computed whatever the CASE says.)

    With a ``step``, a block whose every value is a multiple of it keeps the quotients (and says
    so in ``<column>_step``): values sent at a coarser precision than the column's unit (0.1 W
    in mW...) then cost the bits they have, not the unit's; any other block keeps the values."""
    kept = f"count(s.{column}) > 0 AND {exact}"
    i, lo, var = f"s.i_{column}", f"s.lo_{column}", f"s.var_{column}"

    def stepped(value: str) -> str:
        return value if step is None else f"CASE WHEN s.by_{column} THEN {value} / {step} ELSE {value} END"

    if step is not None:
        i, lo = stepped(i), stepped(lo)
        var = f"CASE WHEN s.by_{column} THEN s.qvar_{column} ELSE {var} END"
    value, base, varying = f"(({i}) # ({lo}))", f"min({lo})", f"min({var})"
    extra: tuple[tuple[str, str], ...] = ()
    if counter:
        # Differences from the previous sample, the first sample's 0, when the block has no NULL
        # and no difference can overflow; its first value is kept (``<column>_first``), its base 0.
        span = stepped(f"(s.hi_{column} - s.lo_{column})")
        fits = (f"(s.full_{column} AND CASE WHEN s.lo_{column} > {-SPAN_GUARD} AND s.hi_{column} < {SPAN_GUARD} "
                f"THEN {span} < {COUNTER_SPAN} ELSE false END)")
        # As the 32 bits of an int4: the higher planes are zeros, not stored.
        difference = f"({stepped(f'coalesce(s.i_{column} - s.pv_{column}, 0)')} & {2**(8 * DIFFERENCE_PLANES) - 1})"
        whole = f"bool_and({fits})"
        value = f"CASE WHEN {fits} THEN {difference} ELSE {value} END"
        base, varying = f"CASE WHEN {whole} THEN 0 ELSE {base} END", (
            f"CASE WHEN {whole} THEN bit_or(CASE WHEN {fits} THEN {difference} END) ELSE {varying} END")
        extra = ((f"first_{column}", f"CASE WHEN {kept} AND {whole} THEN min({stepped(f's.f_{column}')}) END"),)
    aggregates: tuple[tuple[str, str], ...] = (
        (f"x_{column}", f"CASE WHEN {kept} THEN {_ordered(value, layout)} END"),
        (f"base_{column}", f"CASE WHEN {kept} THEN {base} END"),
        (f"var_{column}", varying),
        (f"full_{column}", f"bool_and(s.full_{column})"),
        *extra,
    )
    if step is not None:
        aggregates = (*aggregates, (f"step_{column}", f"CASE WHEN {kept} AND bool_and(s.by_{column}) THEN {step} END"))
    packed = [f"p.base_{column}"]
    for k in range(layout.planes[column]):
        # The low plane carries the NULLs (and a counter's rows: always stored); a higher one is
        # stored only if a byte of it is not 0.
        needed = (f"NOT (p.var_{column} = 0 AND p.full_{column})" if k == 0
                  else f"(p.var_{column} >> {8 * k}) & 255 <> 0")
        if counter and k == 0:
            needed = f"({needed} OR p.first_{column} IS NOT NULL)"
        plane = (f"ARRAY(SELECT (((u.x >> {8 * k}) & 255) - {BYTE_OFFSET})::int4::{BYTE_TYPE} "
                 f"FROM unnest(p.x_{column}) WITH ORDINALITY u(x, n) ORDER BY u.n)")
        packed.append(f"CASE WHEN p.x_{column} IS NOT NULL AND {needed} THEN {plane} END")
    stored = (f"{column}_base", *_plane_names(column, layout))
    if counter:
        stored, packed = (*stored, f"{column}_first"), [*packed, f"p.first_{column}"]
    if step is None:
        return aggregates, stored, tuple(packed)
    return aggregates, (*stored, f"{column}_step"), (*packed, f"p.step_{column}")


def _integer_type(column: str, layout: Layout) -> str:
    return "int4" if layout.planes[column] == 4 else "int8"


def _bytes(column: str, layout: Layout, prefix: str) -> str:
    """SQL: the integer whose bytes are the elements ``<prefix><column>_p<k>``; a missing higher
    plane is zeros (a NULL in the low plane is a NULL value)."""
    kind = _integer_type(column, layout)
    parts = [f"({prefix}{plane}::int4 + {BYTE_OFFSET})::{kind}" + (f" << {8 * k}" if k else "")
             for k, plane in enumerate(_plane_names(column, layout))]
    return " | ".join([parts[0], *(f"coalesce({p}, 0)" for p in parts[1:])])


def _running_sum(column: str, layout: Layout) -> str:
    """SQL over the block ``b``: a counter block's values, its first plus the running sum of its
    differences (NULL for any other block). The differences are added up as int4 into int8
    (sum(int8) would be numeric, several times slower)."""
    planes = _plane_names(column, layout)[:DIFFERENCE_PLANES]
    difference = _bytes(column, Layout(layout.order, {column: DIFFERENCE_PLANES}), "u.")
    return (f"CASE WHEN b.{column}_first IS NOT NULL THEN ARRAY("
            f"SELECT b.{column}_first + sum({difference}) OVER (ORDER BY u.n) "
            f"FROM unnest({', '.join(f'b.{p}' for p in planes)}) WITH ORDINALITY u({', '.join(planes)}, n) "
            f"ORDER BY u.n) END")


def _planes_decode(column: str, layout: Layout, step: int | None = None,
                   counter: bool = False) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """(carried, computed, SQL) giving a column's integer back from its planes; NULL if the block has none."""
    carried = (f"b.{column}_base AS b_{column}_base", f"(b.{column}_p0 IS NULL) AS b_{column}_one")
    decoded = (f"CASE WHEN b_{column}_one THEN b_{column}_base "
               f"ELSE b_{column}_base # ({_bytes(column, layout, 'u_')}) END")
    computed: tuple[str, ...] = ()
    if counter:
        # A counter block's planes are read once, by the running sum; another block's as usual.
        computed = (*(f"unnest(CASE WHEN b.{column}_first IS NULL THEN b.{plane} END) AS u_{plane}"
                      for plane in _plane_names(column, layout)),
                    f"unnest({_running_sum(column, layout)}) AS u_{column}_sum")
        decoded = f"coalesce(u_{column}_sum, {decoded})"
    if step is None:
        return carried, computed, decoded
    # A quotient times the step is the value it was, so it fits the column's type.
    return ((*carried, f"b.{column}_step AS b_{column}_step"), computed,
            f"(({decoded}) * coalesce(b_{column}_step, 1))")


def _integers(column: str, layout: Layout = GPU) -> Encoding:
    """An integer column (int4 or int8) in byte planes (the quotients by its step, if the layout
    has one, when every value of the block is a multiple of it); blocks packed before them kept it
    whole (an array named as the column)."""
    step = layout.steps.get(column)
    aggregates, stored, packed = _planes(column, "true", layout, step)
    carried, _, decoded = _planes_decode(column, layout, step)
    return Encoding(
        column=column,
        integer=f"s.{column}",
        window=_block_window(column, step),
        aggregates=aggregates,
        stored=stored,
        packed=packed,
        arrays=(*_plane_names(column, layout), column),
        carried=carried,
        decode=f"coalesce(u_{column}, {decoded})",
        legacy=(column,),
    )


def _exact(column: str, scale: int | None) -> str:
    """SQL: whether every value of the block is its integer ``i_<column>`` / ``scale`` bit for bit
    (but for -0.0), or, with no ``scale`` (rounded columns), has an integer at all."""
    kept = "true" if scale is None else f"s.i_{column}::float8 / {scale} = s.{column}"
    return f"bool_and(CASE WHEN s.{column} IS NULL THEN true WHEN s.i_{column} IS NULL THEN false ELSE {kept} END)"


def _with_fallback(column: str, exact: str, layout: Layout, fallback: str, step: int | None = None,
                   counter: bool = False) -> _Packing:
    """Byte planes when the block's ``exact`` holds, else the floats as they are in ``fallback``."""
    aggregates, stored, packed = _planes(column, exact, layout, step, counter)
    floats = f"CASE WHEN count(s.{column}) > 0 AND NOT {exact} THEN {_ordered(f's.{column}', layout)} END"
    return (*aggregates, (fallback, floats)), (*stored, fallback), (*packed, f"p.{fallback}")


def _scaled(column: str, legacy: str | None, *, layout: Layout = GPU, fallback: str | None = None) -> Encoding:
    """A float8 column whose values are ``integer / scale`` (its :class:`Scale` in the layout):
    byte planes of the integers (of their quotients by its step, if it has one, when every one is
    a multiple of it), when every value of the block comes back exactly (or, ``rounded``, fits),
    else the floats in ``fallback`` (by default ``<column>_f``). ``legacy`` is the integer array of
    blocks packed before 0015, if the column had one."""
    scale, step = layout.scales[column].scale, layout.steps.get(column)
    fallback = fallback or f"{column}_f"
    scaled = f"s.{column}::float8{f' * {scale}' if scale != 1 else ''}"
    bound = layout.scales[column].bound
    integer = (f"CASE WHEN s.{column} BETWEEN {-bound} AND {bound} "
               f"THEN round({scaled})::{_integer_type(column, layout)} END")
    # The test decodes with the reader's expression, so "exact" means bit-for-bit (but for -0.0).
    # BETWEEN also refuses NaN and infinities, which PostgreSQL would otherwise call equal.
    aggregates, stored, packed = _with_fallback(
        column, _exact(column, None if layout.scales[column].rounded else scale), layout, fallback, step)
    carried, _, decoded = _planes_decode(column, layout, step)
    integers = f"coalesce(u_{legacy}, {decoded})" if legacy else decoded
    return Encoding(
        column=column,
        integer=integer,
        window=_block_window(column, step),
        aggregates=aggregates,
        stored=stored,
        packed=packed,
        arrays=tuple(dict.fromkeys((*_plane_names(column, layout), fallback, *([legacy] if legacy else [])))),
        carried=carried,
        decode=f"coalesce(u_{fallback}, ({integers})::float8 / {scale})",
        legacy=(legacy,) if legacy else (),
    )


def _energy() -> Encoding:
    """``energy_j``: byte planes of whole mJ, when every value is whole mJ under 4e12 J; a counter
    (its differences, migration 0019). Blocks before 0015 kept int4 offsets (``energy_mj``) from a
    base (``energy_mj_base``)."""
    step = GPU.steps["energy_j"]
    aggregates, stored, packed = _with_fallback("energy_j", _exact("energy_j", _ENERGY.scale), GPU, "energy_j_f",
                                                step, counter=True)
    carried, computed, decoded = _planes_decode("energy_j", GPU, step, counter=True)
    return Encoding(
        column="energy_j",
        integer=f"({ENERGY_MJ})::int8",
        window=_block_window("energy_j", step, counter=True),
        aggregates=aggregates,
        stored=stored,
        packed=packed,
        arrays=("energy_j_f", "energy_mj"),
        carried=(*carried, "b.energy_mj_base AS b_energy_mj_base"),
        decode=(f"coalesce(u_energy_j_f, (coalesce(b_energy_mj_base + u_energy_mj, {decoded}))::float8 "
                f"/ {_ENERGY.scale})"),
        legacy=("energy_mj_base", "energy_mj"),
        computed=computed,
    )


def _planed(encodings: Iterable[Encoding]) -> list[Encoding]:
    return [e for e in encodings if e.integer is not None]


def pack_integers(encodings: Iterable[Encoding]) -> str:
    """Packing's first step, SQL for the select list over the samples ``s``: each sample's ``i_<column>``."""
    return ", ".join(f"{e.integer} AS i_{e.column}" for e in _planed(encodings))


def pack_window(encodings: Iterable[Encoding]) -> str:
    """The second step, over the window ``g`` of a block: what is known of its integers."""
    return ", ".join(w for e in _planed(encodings) for w in e.window)


def pack_aggregates(encodings: Iterable[Encoding]) -> str:
    """The third step, over the samples ``s`` of a block (GROUP BY): its arrays and bounds."""
    return ", ".join(f"{sql} AS {name}" for e in encodings for name, sql in e.aggregates)


def pack_columns(encodings: Iterable[Encoding]) -> tuple[str, str]:
    """The last step: (the block's columns to INSERT, their values over the aggregated block ``p``)."""
    listed = list(encodings)
    return (", ".join(c for e in listed for c in e.stored), ", ".join(v for e in listed for v in e.packed))


def unpacking(encodings: Sequence[Encoding]) -> tuple[list[str], list[str]]:
    """What reading ``encodings`` takes from each block ``b``: (the select list of the block's row,
    its arrays unnested as ``u_<array>`` and its carried columns as ``b_<name>``; the decoded values
    over that row, each named as its column)."""
    arrays = dict.fromkeys(array for e in encodings for array in e.arrays)
    carried = dict.fromkeys(c for e in encodings for c in e.carried)
    row = [*carried, *(f"unnest(b.{a}) AS u_{a}" for a in arrays), *(c for e in encodings for c in e.computed)]
    return row, [f"{e.decode} AS {e.column}" for e in encodings]


ENCODINGS: Final[dict[str, Encoding]] = {
    e.column: e
    for e in (
        _scaled("util_gpu", "util_gpu"),
        _scaled("util_mem", "util_mem"),
        _integers("mem_used"),
        _integers("mem_total"),
        _scaled("power_w", "power_mw"),
        _energy(),
        _scaled("temp_c", "temp_c"),
        _integers("sm_clock_mhz"),
        _integers("mem_clock_mhz"),
        _integers("pcie_tx_kbs"),
        _integers("pcie_rx_kbs"),
        _integers("throttle_reasons"),
        _integers("ecc_errors"),
        _integers("process_count"),
        _scaled("sm_active", "sm_active"),
        _scaled("tensor_active", "tensor_active"),
        _plain("lost"),
        _integers("nvlink_crc_errors"),
        _integers("nvlink_replay_errors"),
        _integers("nvlink_recovery_errors"),
        _integers("pcie_replays"),
        _plain("remapped_rows_pending"),
        _plain("remap_failure"),
        _plain("retired_pages_pending"),
    )
}
"""Every measurement column of ``gpu_samples``, in table order: byte planes of integers (scaled
floats among them), the energy counter, the booleans as plain arrays."""


HOST_VALUES: Final = tuple(c.name for c in host_samples.columns if c.name not in SERIES_KEY)
"""The measurements of a host sample (``cpu_util``, ``cpu_time_s``, ``mem_used``, ``mem_limit``,
the node's ``energy_j`` and where it came from)."""

HOST: Final = Layout(", ".join(f"s.{c}" for c in ("ts", *HOST_VALUES)), HOST_PLANES, HOST_SCALES)
"""``host_sample_blocks``: every array in the same order, all columns breaking ties, so that the
arrays stay in step even for two samples of one node at one time."""

HOST_ENCODINGS: Final[dict[str, Encoding]] = {
    e.column: e
    for e in (
        _scaled("cpu_util", None, layout=HOST, fallback="cpu_util"),
        _scaled("cpu_time_s", None, layout=HOST, fallback="cpu_time_s"),
        _integers("mem_used", HOST),
        _integers("mem_limit", HOST),
        _plain("energy_j", HOST),
        _plain("power_source", HOST),
        _plain("energy_split", HOST),
    )
}
"""Every measurement column of ``host_samples`` in ``host_sample_blocks`` (migration 0016): the
CPU's and memory's in byte planes, as the GPU columns; the arrays named as the columns are the
floats of a block that is not such integers, and every column of the blocks packed before."""
