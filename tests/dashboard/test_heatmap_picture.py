"""The heatmap's picture (jobsight.dashboard.heatmap_picture): Vega's own colours, a PNG any decoder reads
back cell for cell, and gaps left transparent."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import streamlit

from jobsight.dashboard import heatmap_picture
from tests.dashboard import drawn_heatmap

STREAMLIT_JS = Path(streamlit.__file__).parent / "static" / "static" / "js"


def test_the_colours_are_the_viridis_scheme_of_the_vega_that_streamlit_ships() -> None:
    """The legend is drawn by the browser's Vega from its ``viridis`` scheme; the cells are coloured
    here. They agree only while the stops are the same, so a Streamlit upgrade that changes them fails here."""
    shipped = set()
    for script in STREAMLIT_JS.glob("*.js"):
        shipped |= set(re.findall(r"viridis:[`'\"]([0-9a-f]+)[`'\"]", script.read_text(errors="replace")))
    assert shipped == {heatmap_picture.VIRIDIS}


def test_values_are_interpolated_between_the_stops_as_vega_does() -> None:
    stops = [tuple(int(heatmap_picture.VIRIDIS[i + j:i + j + 2], 16) for j in (0, 2, 4))
             for i in range(0, len(heatmap_picture.VIRIDIS), 6)]
    assert len(stops) == 31
    drawn = heatmap_picture.colours(np.array([0.0, 100.0, 15.5 / 30 * 100, -5.0, 130.0, np.nan, 50.0]))
    assert tuple(drawn[0]) == (*stops[0], 255) and tuple(drawn[1]) == (*stops[-1], 255)
    assert tuple(drawn[6]) == (*stops[15], 255)  # 31 stops evenly over 0-100: 50 % is the 16th
    # Halfway between the 16th and the 17th stop, in RGB.
    halfway = [(a + b) / 2 for a, b in zip(stops[15], stops[16], strict=True)]
    assert all(abs(int(d) - h) <= 0.5 for d, h in zip(drawn[2][:3], halfway, strict=True)) and drawn[2][3] == 255
    assert tuple(drawn[3]) == tuple(drawn[0]) and tuple(drawn[4]) == tuple(drawn[1])  # clamped to the legend's
    assert drawn[5][3] == 0  # no sample: transparent


@pytest.mark.parametrize("row_px", [1, 3])
def test_the_png_reads_back_pixel_for_pixel(row_px: int) -> None:
    rng = np.random.default_rng(7)
    rgba = rng.integers(0, 256, size=(5, 37, 4), dtype=np.uint8)
    pixels = drawn_heatmap.pixels_of(heatmap_picture.data_url(rgba, row_px))
    assert pixels.shape == (5 * row_px, 37, 4)
    assert (pixels == np.repeat(rgba, row_px, axis=0)).all()


def test_the_picture_has_a_row_a_gpu_in_order_and_leaves_missing_buckets_empty() -> None:
    start = pd.Timestamp("2026-11-28T10:00:00Z")
    width = pd.Timedelta(seconds=15)
    cells = pd.DataFrame([
        {"gpu": "n2:0", "bucket": start, "util_gpu": 90.0},
        {"gpu": "n1:0", "bucket": start + 3 * width, "util_gpu": 10.0},  # none between: an outage
        {"gpu": "n1:0", "bucket": start, "util_gpu": 20.0},
        {"gpu": "n2:0", "bucket": start + width, "util_gpu": None},  # a bucket with no value
    ])
    drawn = heatmap_picture.picture(cells, width, ["n1:0", "n2:0"])
    assert (drawn.start, drawn.end, drawn.buckets) == (start, start + 4 * width, 4)
    pixels = drawn_heatmap.pixels_of(drawn.url)
    # Few buckets: a pixel a cell, drawn unsmoothed (the browser enlarges it into blocks, no gradient).
    assert pixels.shape == (2, 4, 4) and drawn.smooth is False
    grid = pixels
    assert [tuple(grid[0, c]) for c in (0, 3)] == [drawn_heatmap.colour(20.0), drawn_heatmap.colour(10.0)]
    assert tuple(grid[1, 0]) == drawn_heatmap.colour(90.0)
    assert grid[0, 1:3, 3].tolist() == [0, 0] and grid[1, 1:, 3].tolist() == [0, 0, 0]


@pytest.mark.parametrize(("buckets", "gpus"), [(heatmap_picture.CRISP_MAX_BUCKETS + 1, 2), (2000, 64)])
def test_a_picture_of_many_buckets_is_large_enough_to_be_shrunk_smoothed(buckets: int, gpus: int) -> None:
    """Past CRISP_MAX_BUCKETS the browser may shrink the picture, which unsmoothed would drop buckets: it is
    drawn smoothed, at least MIN_PICTURE_PX, each cell a block of one colour (smoothing blurs what it stretches)."""
    start, width = pd.Timestamp("2026-11-28T10:00:00Z"), pd.Timedelta(seconds=1)
    values = np.arange(buckets * gpus, dtype=float) % 101
    cells = pd.DataFrame({"gpu": np.repeat([f"n1:{g}" for g in range(gpus)], buckets),
                          "bucket": np.tile(start + width * np.arange(buckets), gpus), "util_gpu": values})
    drawn = heatmap_picture.picture(cells, width, [f"n1:{g}" for g in range(gpus)])
    pixels = drawn_heatmap.pixels_of(drawn.url)
    assert drawn.smooth is True and drawn.buckets == buckets
    assert pixels.shape[1] >= heatmap_picture.MIN_PICTURE_PX[0] and pixels.shape[0] >= heatmap_picture.MIN_PICTURE_PX[1]
    frame = pd.DataFrame({"url": [drawn.url], "buckets": [buckets], "start": [drawn.start], "end": [drawn.end]})
    drawn_cells = drawn_heatmap.cells([frame, pd.DataFrame({"gpu": [f"n1:{g}" for g in range(gpus)], "tip": ""})])
    assert [tuple(c) for c in drawn_cells["rgba"]] == [drawn_heatmap.colour(v) for v in values]
