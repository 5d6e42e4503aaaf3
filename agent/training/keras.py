"""Keras 3: a thin callback with epoch and batch timing, logs as metrics, and one profiled epoch.

The two lines::

    from jobsight.agent.training.keras import JobsightCallback
    model.fit(x, y, epochs=5, callbacks=[JobsightCallback(profile_epoch=2)])

``profile_epoch`` is the epoch index Keras passes to ``on_epoch_begin`` (0-based;
Keras prints it as "Epoch N+1/…"). That epoch alone is profiled, from its
``on_epoch_begin`` to its ``on_epoch_end``, with the backend's profiler: torch →
``torch.profiler`` (summary, breakdown, diagnosis and trace uploaded), TensorFlow →
``tf.profiler.experimental`` and JAX → ``jax.profiler`` (trace written to
``profile_dir`` for TensorBoard; the upload says where). Another backend gets a
warning and no profile, never an error.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import Any, Unpack

import keras

from jobsight.agent.training.fit_telemetry import CallbackKeywords, CallbackOptions, FitTelemetry
from jobsight.agent.training.profile_schedule import ProfileOptions
from jobsight.agent.training.profiling import ProfileWindow
from jobsight.agent.training.run_records import TrainingRun, warn_rank_zero
from jobsight.protocol.json_safe import json_safe
from jobsight.protocol.run_events import FIT_END

PROFILABLE = ("torch", "tensorflow", "jax")


class JobsightCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Telemetry for ``model.fit``; see the module docstring.

    ``metrics_every_n_batches``: how often batch logs are sent as metrics (epoch logs,
    validation included, are always sent). ``options``:
    :class:`~jobsight.agent.training.fit_telemetry.CallbackOptions` (on_demand, logs, settings,
    demo, run_name, flush_timeout_s).
    """

    def __init__(
        self,
        *,
        profile_epoch: int | None = None,
        profile_dir: str | None = None,
        profile_options: ProfileOptions | None = None,
        metrics_every_n_batches: int = 10,
        **options: Unpack[CallbackKeywords],
    ) -> None:
        super().__init__()
        if profile_epoch is not None and (isinstance(profile_epoch, bool) or not isinstance(profile_epoch, int)
                                          or profile_epoch < 0):
            raise ValueError(f"profile_epoch must be a non-negative int (0 is the first epoch), not {profile_epoch!r}")
        if metrics_every_n_batches < 1:
            raise ValueError("metrics_every_n_batches must be >= 1")
        self._telemetry = FitTelemetry(CallbackOptions(**options))
        self.backend = keras.backend.backend()
        self.profile_epoch = profile_epoch
        if profile_epoch is not None and self.backend not in PROFILABLE:
            warn_rank_zero(None, f"jobsight: cannot profile the Keras {self.backend!r} backend "
                                 f"(only {', '.join(PROFILABLE)}); profile_epoch={profile_epoch} is ignored")
            self.profile_epoch = None
        self._profile_dir = profile_dir
        self._options = profile_options or ProfileOptions()
        self._every = metrics_every_n_batches
        self._epoch = 0
        self._profile_first = 0
        self._window: ProfileWindow | None = None
        self._native_dir: str | None = None
        self.profiled_epochs: list[int] = []

    @property
    def run(self) -> TrainingRun | None:
        return self._telemetry.run

    @property
    def _batches(self) -> int:
        return self._telemetry.batches

    def _warn(self, message: str) -> None:
        rank = self.run.recorder.rank if self.run is not None else None
        warn_rank_zero(rank, message)

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        telemetry = self._telemetry
        run = telemetry.open(rank=None, profile_options=self._options,
                             extra={"framework": "keras", "backend": self.backend})
        if run is None:
            return
        try:
            model = self.model
            meta = {
                "framework": "keras", "keras_version": keras.__version__, "backend": self.backend,
                "params": json_safe(dict(self.params or {})), "model": getattr(model, "name", None),
                "parameters": int(model.count_params()) if model is not None and model.built else None,
                "dtype_policy": str(getattr(getattr(model, "dtype_policy", None), "name", None)),
            }
            telemetry.started(meta, "fit started", backend=self.backend)
            run.profiling.begin(0)
        except Exception as exc:  # noqa: BLE001 - boundary: telemetry never fails the fit
            telemetry.warn_once("fit start", exc)

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        if self.run is not None:
            self._stop_profile()
        self._telemetry.close("fit finished", FIT_END)

    # -- epochs and batches --------------------------------------------------------------------

    def on_epoch_begin(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        self._epoch = epoch
        if epoch == self.profile_epoch and self.run is not None:
            self._start_profile(epoch)
        self._telemetry.epoch_started()

    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        if self.run is None:
            return
        try:
            duration = self._telemetry.timer.since_epoch_start()  # the profiler's export is not the epoch's
            if self._window is not None or self._native_dir is not None:
                self._stop_profile()
            self._telemetry.epoch_ended(epoch, dict(logs or {}), self._batches, duration)
        except Exception as exc:  # noqa: BLE001 - boundary: telemetry never fails the fit
            self._telemetry.warn_once("epoch hook", exc)

    def on_train_batch_begin(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        self._telemetry.batch_started()

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        telemetry = self._telemetry
        try:
            run = telemetry.batch_ended(self._epoch)
            if run is not None:
                if logs and telemetry.batches % self._every == 0:
                    run.recorder.metrics(dict(logs), telemetry.batches)
                if self._window is not None:
                    self._window.step()
                else:
                    run.profiling.after_step(telemetry.batches)
        except Exception as exc:  # noqa: BLE001 - boundary: telemetry never fails the fit
            telemetry.warn_once("batch hook", exc)
        telemetry.between_steps()

    def on_test_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        self._telemetry.validation_started()

    def on_test_end(self, logs: Mapping[str, Any] | None = None) -> None:
        self._telemetry.validation_ended(self._epoch, None, None)

    # -- the profiled epoch ----------------------------------------------------------------------

    def _start_profile(self, epoch: int) -> None:
        run = self.run
        assert run is not None
        if run.profiling.window is not None:
            self._warn(f"jobsight: an on-demand profile is running; epoch {epoch} is not profiled")
            return
        try:
            if self.backend == "torch":
                window = ProfileWindow(
                    run.recorder, None, self._options, first_step=self._batches,
                    extra={**run.profiling.extra, "epoch": epoch},
                )
                window.start()
                self._window = window
            else:
                directory = self._profile_dir or tempfile.mkdtemp(prefix=f"jobsight-keras-epoch{epoch}-")
                os.makedirs(directory, exist_ok=True)
                if self.backend == "tensorflow":
                    import tensorflow as tf

                    tf.profiler.experimental.start(directory)
                else:
                    import jax

                    jax.profiler.start_trace(directory)
                self._native_dir = directory
            self._profile_first = self._batches
            self.profiled_epochs.append(epoch)
        except Exception as exc:  # noqa: BLE001 - boundary: e.g. another profiler is already running
            self._window = None
            self._warn(f"jobsight: could not profile epoch {epoch} with the {self.backend} profiler ({exc!r})")

    def _stop_profile(self) -> None:
        """Stop only the profiler this callback started."""
        run = self.run
        window, self._window = self._window, None
        directory, self._native_dir = self._native_dir, None
        try:
            if window is not None:
                window.stop()
            elif directory is not None:
                if self.backend == "tensorflow":
                    import tensorflow as tf

                    tf.profiler.experimental.stop()
                else:
                    import jax

                    jax.profiler.stop_trace()
                if run is not None:
                    run.recorder.profile({
                        "profile_id": os.path.basename(directory.rstrip("/")), "request_id": None,
                        "step_start": self._profile_first, "step_end": self._batches - 1,
                        "summary": {"framework": "keras", "backend": self.backend, "epoch": self._epoch,
                                    "steps": self._batches - self._profile_first, "trace_dir": directory},
                        "diagnosis": None, "trace_gz_b64": None,
                        "note": f"{self.backend} profile written to {directory} on {run.recorder.context.node}; "
                                "open it with TensorBoard's profile plugin",
                    })
        except Exception as exc:  # noqa: BLE001 - boundary: telemetry never fails the fit
            self._warn(f"jobsight: stopping the {self.backend} profiler failed ({exc!r})")
