"""The GPU heatmap's cells as the browser draws them, read back from the chart's picture.

:func:`jobsight.dashboard.charts.gpu_heatmap` sends one PNG, a row a GPU and a column a bucket, beside
a row a GPU for the tooltips. These helpers decode the PNG (with Pillow, as an image viewer would) and
give each drawn cell's GPU, time span and colour, so tests assert on what is drawn, not on how."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image

from jobsight.dashboard import heatmap_picture


def _frame(data: Any) -> pd.DataFrame:
    """A dataset as a frame: :func:`jobsight.dashboard.vega.spec` keeps frames, Altair's ``to_dict()`` rows."""
    return data if isinstance(data, pd.DataFrame) else pd.DataFrame(list(data))


def cells(datasets: Iterable[Any] | Mapping[str, Any]) -> pd.DataFrame:
    """The heatmap's drawn cells from its datasets (a spec's ``datasets``, or their frames): ``gpu``,
    ``bucket`` and ``end`` (UTC), ``rgba`` (a tuple) for every opaque cell, in the rows' order."""
    frames = [_frame(d) for d in (datasets.values() if isinstance(datasets, Mapping) else datasets)]
    image = next(f for f in frames if "url" in f.columns).iloc[0]
    gpus = list(next(f for f in frames if "tip" in f.columns)["gpu"])
    pixels = pixels_of(str(image["url"]))
    buckets = int(image["buckets"])
    height, width = pixels.shape[:2]
    assert height % len(gpus) == 0 and width % buckets == 0, (pixels.shape, len(gpus), buckets)
    row_px, column_px = height // len(gpus), width // buckets
    # Every pixel of a cell has the cell's colour: a row and a column are repeats of one value.
    grid = pixels[::row_px, ::column_px]
    assert (np.repeat(np.repeat(grid, row_px, axis=0), column_px, axis=1) == pixels).all()
    start, end = pd.to_datetime(image["start"], utc=True), pd.to_datetime(image["end"], utc=True)
    step = (end - start) / buckets
    return pd.DataFrame([
        {"gpu": gpu, "bucket": start + column * step, "end": start + (column + 1) * step,
         "rgba": tuple(int(v) for v in grid[row, column])}
        for row, gpu in enumerate(gpus) for column in range(buckets) if grid[row, column, 3] > 0
    ], columns=["gpu", "bucket", "end", "rgba"])


def pixels_of(url: str) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """A ``data:image/png;base64,…`` URL's pixels, rows × columns × RGBA."""
    kind, _, body = url.partition(",")
    assert kind == "data:image/png;base64", kind
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(body))).convert("RGBA"))


def colour(utilisation: float) -> tuple[int, ...]:
    """The RGBA the heatmap draws ``utilisation`` in."""
    return tuple(int(v) for v in heatmap_picture.colours(np.array([utilisation], dtype=float))[0])
