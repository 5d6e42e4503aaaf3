"""The GPU heatmap as one picture: a PNG with a row a GPU and a column a bucket, coloured here.

Drawn as a Vega item a cell, a 64-GPU job's 8,000 cells cost the browser about 0.35 s of a page load
(Vega builds, lays out and hit-tests a scene item a cell; sending fewer bytes a cell did not help).
As one picture it is one item whatever the GPUs and the time resolution, and a few kilobytes.

The colours are Vega's own ``viridis`` (:data:`VIRIDIS`, the 31 colours Vega interpolates between in
RGB), so the cells match the legend Vega draws beside them from the same scheme."""

from __future__ import annotations

import base64
import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pandas as pd

VIRIDIS: Final = (
    "440154470e61481a6c482575472f7d443a834144873d4e8a39568c35608d31688e2d708e2a788e27818e23888e21918d"
    "1f988b1fa08822a8842ab07f35b77943bf7154c56866cc5d7ad1518fd744a5db36bcdf27d2e21be9e51afde725"
)
"""Vega's ``viridis`` scheme as Vega ships it: 31 colours, evenly spaced over the scale's domain."""
_STOPS: Final = np.array([[int(VIRIDIS[i + j:i + j + 2], 16) for j in (0, 2, 4)]
                          for i in range(0, len(VIRIDIS), 6)], dtype=float)

UTILISATION_DOMAIN: Final = (0.0, 100.0)
MIN_PICTURE_PX: Final = (1536, 512)
"""A picture of more than :data:`CRISP_MAX_BUCKETS` buckets is at least this many pixels wide and tall,
a bucket repeated across several pixels when there are fewer buckets, a GPU's row down several when
there are fewer GPUs: such a picture is drawn smoothed, and the browser smooths a picture it resizes,
so two one-pixel rows stretched down a page would blur into a gradient that reads as data. Shrunk
instead, a picture's neighbouring buckets blend into a pixel, as cells narrower than a pixel did."""

CRISP_MAX_BUCKETS: Final = 512
"""At most this many buckets, the picture has one pixel a cell and is drawn unsmoothed (Vega's image
``smooth: false``): the browser only enlarges it, a cell into a block of pixels, since the heatmap is
wider than this on any screen (the dashboard's layout is wide) and gives a GPU at least three pixels
of height (``charts._heatmap_px``). A 64-GPU job's recent window is 125 buckets: 8,000 pixels to
encode and decode, not 786,432. Unsmoothed, a shrunk picture would drop whole buckets, so more
buckets than this are repeated to :data:`MIN_PICTURE_PX` and smoothed."""


def colours(values: npt.NDArray[np.float64]) -> npt.NDArray[np.uint8]:
    """RGBA for each utilisation in ``values`` (``NaN``: transparent, no sample in the bucket), clamped
    to :data:`UTILISATION_DOMAIN`, interpolated in RGB between Vega's viridis stops as Vega does."""
    low, high = UTILISATION_DOMAIN
    position = np.clip((np.nan_to_num(values, nan=low) - low) / (high - low), 0.0, 1.0) * (len(_STOPS) - 1)
    below = np.minimum(np.floor(position).astype(int), len(_STOPS) - 2)
    share = (position - below)[..., None]
    rgb = _STOPS[below] * (1 - share) + _STOPS[below + 1] * share
    alpha = np.where(np.isnan(values), 0, 255)[..., None]
    return np.concatenate([np.rint(rgb), alpha], axis=-1).astype(np.uint8)


def png(rgba: npt.NDArray[np.uint8], row_px: int = 1) -> bytes:
    """``rgba`` (rows × columns × 4) as a PNG, each row ``row_px`` pixels tall. A row's first line is
    filtered by its left neighbour ("Sub") and its repeats by the line above ("Up", all zeros), so
    buckets repeated across pixels and rows compress to almost nothing."""
    rows, width, _ = rgba.shape
    lines = np.zeros((rows, row_px, 1 + width * 4), np.uint8)
    lines[:, 0, 0] = 1
    sub = lines[:, 0, 1:].reshape(rows, width, 4)
    sub[:, 0] = rgba[:, 0]
    np.subtract(rgba[:, 1:], rgba[:, :-1], out=sub[:, 1:])  # modulo 256, as PNG's filters are
    lines[:, 1:, 0] = 2

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, rows * row_px, 8, 6, 0, 0, 0)  # 8 bits a channel, RGBA
    # Filtered, the picture is runs of zeros: run-length matching at the fastest level packs them as
    # tightly as a full search does, in a fraction of its time.
    packer = zlib.compressobj(1, zlib.DEFLATED, 15, 9, zlib.Z_RLE)
    body = packer.compress(lines.tobytes()) + packer.flush()
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


def data_url(rgba: npt.NDArray[np.uint8], row_px: int = 1) -> str:
    return "data:image/png;base64," + base64.b64encode(png(rgba, row_px)).decode("ascii")


@dataclass(frozen=True)
class Picture:
    """A heatmap as one picture: ``buckets`` columns from ``start`` to ``end``, a row a GPU."""

    start: pd.Timestamp
    end: pd.Timestamp
    buckets: int
    url: str
    """The picture as a ``data:`` URL (PNG)."""
    smooth: bool
    """Whether the browser may smooth it as it resizes it (:data:`CRISP_MAX_BUCKETS`)."""


def picture(cells: pd.DataFrame, width: pd.Timedelta, gpus: Sequence[str]) -> Picture:
    """The heatmap of ``cells`` (``gpu``, ``bucket``, ``util_gpu``; buckets ``width`` apart on one grid) as
    one picture, a row a GPU in the order of ``gpus``, a column a bucket from the first bucket to the last,
    transparent where a GPU has no sample."""
    first, last = cells["bucket"].min(), cells["bucket"].max()
    buckets = int(round((last - first) / width)) + 1
    column = ((cells["bucket"] - first) / width).round().astype(int).to_numpy()
    grid = np.full((len(gpus), buckets), np.nan)
    grid[pd.Index(gpus).get_indexer(cells["gpu"]), column] = cells["util_gpu"].astype(float).to_numpy()
    if buckets <= CRISP_MAX_BUCKETS:
        return Picture(first, last + width, buckets, data_url(colours(grid)), smooth=False)
    repeat = max(1, math.ceil(MIN_PICTURE_PX[0] / buckets))
    row_px = max(1, math.ceil(MIN_PICTURE_PX[1] / len(gpus)))
    return Picture(first, last + width, buckets, data_url(np.repeat(colours(grid), repeat, axis=1), row_px),
                   smooth=True)
