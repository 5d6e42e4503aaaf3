"""Build the fake ``libnvidia-ml.so.1`` with gcc (``python tests/fake_nvml/build.py``).

The library is rebuilt only when ``fake_nvml.c`` is newer than it. Tests call
:func:`build_fake_nvml` and skip when it raises :class:`GccMissing`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "fake_nvml.c"
LIBRARY = HERE / "build" / "libnvidia-ml.so.1"
SCENARIOS = HERE / "scenarios"


class GccMissing(RuntimeError):
    """No C compiler on PATH, so the fake library cannot be built."""


def build_fake_nvml(force: bool = False) -> Path:
    """Return the path of the fake library, compiling it first if it is stale."""
    if not force and LIBRARY.exists() and LIBRARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return LIBRARY
    gcc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("gcc")
    if gcc is None:
        raise GccMissing("gcc not found on PATH; cannot build the fake libnvidia-ml.so.1")
    LIBRARY.parent.mkdir(parents=True, exist_ok=True)
    # Compile to a temporary name and rename, so a concurrent test run (xdist)
    # never loads a half-written library.
    fd, tmp = tempfile.mkstemp(dir=LIBRARY.parent, prefix=".libnvidia-ml.", suffix=".so")
    os.close(fd)
    try:
        subprocess.run(
            [
                gcc,
                "-shared",
                "-fPIC",
                "-O1",
                "-std=c11",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-fvisibility=hidden",
                "-Wl,-soname,libnvidia-ml.so.1",
                "-o",
                tmp,
                str(SOURCE),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        os.replace(tmp, LIBRARY)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"building the fake NVML library failed:\n{exc.stderr}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return LIBRARY


if __name__ == "__main__":
    try:
        path = build_fake_nvml(force="--force" in sys.argv[1:])
    except (GccMissing, RuntimeError) as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
    print(path)
