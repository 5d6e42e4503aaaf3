"""The one door into NVML: the only module that imports pynvml (CONTRIBUTING rule 6).

pynvml is imported lazily, so ``import jobsight.agent.node.gpu.nvml`` works without nvidia-ml-py.
:class:`Nvml` loads the library (the system one, or a path: tests pass the fake), initialises NVML
on first use under its lock, and shuts it down at exit. Every value is asked through
:meth:`Nvml.query`: a field the GPU or driver cannot give becomes ``None``, logged once per device
and field; NotSupported and FunctionNotFound are remembered (:attr:`Nvml.absent`) and not asked
again; a GPU that fell off the bus raises :class:`GpuLost` for the caller to mark.

What is read through the door is the sampler's (:mod:`jobsight.agent.node.gpu.sampler`), with the
fault counters (:mod:`~jobsight.agent.node.gpu.faults`) and the Xid events
(:mod:`~jobsight.agent.node.gpu.events`).
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import logging
import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar

log = logging.getLogger("jobsight.agent.nvml")

T = TypeVar("T")

# nvmlReturn_t codes, named here so they can be used before pynvml is imported.
NVML_SUCCESS: Final = 0
NVML_ERROR_NOT_SUPPORTED: Final = 3
NVML_ERROR_FUNCTION_NOT_FOUND: Final = 13
NVML_ERROR_GPU_IS_LOST: Final = 15


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this node; ``str()`` is one line fit for a user."""


class GpuLost(Exception):
    """The GPU being read fell off the bus: the caller marks it lost and asks it nothing more."""


def _import_pynvml() -> Any:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise NvmlUnavailable(
            "nvidia-ml-py is not installed; install the agent extra: pip install 'jobsight[agent]'"
        ) from None


def _load_library(nv: Any, path: str) -> None:
    """Make pynvml call the library at ``path`` instead of the system one."""
    try:
        library = ctypes.CDLL(path)
    except OSError as exc:
        raise NvmlUnavailable(f"cannot load the NVML library {path}: {exc}") from None
    with nv.libLoadLock:
        current = nv.nvmlLib
        if current is not None and getattr(current, "_name", None) == path:
            return
        if current is not None and nv._nvmlLib_refcount > 0:
            raise NvmlUnavailable(
                f"NVML is already in use from {current._name} in this process; cannot switch to {path}"
            )
        nv.nvmlLib = library
        nv._nvmlGetFunctionPointer_cache.clear()


def _init_failure_message(nv: Any, exc: Exception) -> str:
    if isinstance(exc, nv.NVMLError_LibraryNotFound):
        return "the NVIDIA driver library libnvidia-ml.so.1 was not found; is the NVIDIA driver installed on this node?"
    if isinstance(exc, nv.NVMLError_DriverNotLoaded):
        return "the NVIDIA kernel driver is not loaded (nvmlInit: Driver Not Loaded); is there a GPU on this node?"
    if isinstance(exc, nv.NVMLError_NoPermission):
        return "no permission to use NVML (nvmlInit: Insufficient Permissions)"
    return f"NVML could not be initialised: {exc}"


def _keep(_nv: Any) -> None:
    """Nothing to release before the shutdown."""


class Nvml:
    """One NVML session: opened lazily, shut down once, every call through :meth:`query`.

    ``library_path`` names a ``libnvidia-ml.so.1`` to use; ``None`` lets pynvml load the system
    library. ``release`` is called with pynvml, under :attr:`lock`, before ``nvmlShutdown``: what
    the caller allocated from NVML (GPM samples, an event set) is freed while NVML still runs.

    NVML's handles and this door's state are used by one thread at a time: whoever reads through
    the door holds :attr:`lock` (the ``*_locked`` methods expect it held).
    """

    def __init__(self, library_path: str | None = None, release: Callable[[Any], None] = _keep) -> None:
        self._library_path = library_path
        self._release = release
        self.lock = threading.Lock()
        self.nv: Any = None
        """pynvml while NVML is open; ``None`` before the first open and after :meth:`close`."""
        self.absent: set[tuple[str, str]] = set()
        """(device key, field name) a device lacks (NotSupported, FunctionNotFound): never asked again."""
        self._logged: set[tuple[str, str]] = set()

    def open_locked(self) -> tuple[Any, bool]:
        """pynvml, with NVML initialised; ``True`` when this call initialised it (the caller then
        finds its GPUs). Raises :class:`NvmlUnavailable` when the library, driver or nvmlInit fails."""
        if self.nv is not None:
            return self.nv, False
        nv = _import_pynvml()
        if self._library_path is not None:
            _load_library(nv, self._library_path)
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise NvmlUnavailable(_init_failure_message(nv, exc)) from None
        self.nv = nv
        atexit.register(self.close)
        return nv, True

    def close(self) -> None:
        """Release what the caller holds and shut NVML down; safe to call twice. A later
        :meth:`open_locked` opens it again."""
        with self.lock:
            nv, self.nv = self.nv, None
            if nv is None:
                return
            atexit.unregister(self.close)
            self._release(nv)
            try:
                nv.nvmlShutdown()
            except nv.NVMLError as exc:
                log.debug("nvmlShutdown failed: %s", exc)

    def query(self, key: str, name: str, fn: Callable[..., T], *args: Any) -> T | None:
        """Call one NVML function; ``None`` when this device cannot give the value.

        NotSupported and FunctionNotFound are permanent, so the field is not asked
        again; other errors lose the field for this tick only. Both are logged
        once per device and field. A lost GPU raises :class:`GpuLost`.
        """
        nv = self.nv
        if (key, name) in self.absent:
            return None
        try:
            return fn(*args)
        except nv.NVMLError_GpuIsLost:
            raise GpuLost() from None
        except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound) as exc:
            # Expected on many GPUs (MIG devices, consumer cards, old drivers): debug only.
            self.absent.add((key, name))
            self.log_once(logging.DEBUG, key, name, exc)
        except nv.NVMLError as exc:
            self.log_once(logging.WARNING, key, name, exc)
        return None

    def log_once(self, level: int, key: str, name: str, exc: Exception) -> None:
        """Say once per device and field that NVML could not give it."""
        if (key, name) not in self._logged:
            self._logged.add((key, name))
            log.log(level, "NVML %s unavailable on %s: %s", name, key, exc)
