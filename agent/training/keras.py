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
import time
from collections.abc import Mapping
from typing import Any

import keras

from jobsight.agent.settings import AgentSettings
from jobsight.agent.training.profile_schedule import ProfileOptions
from jobsight.agent.training.profiling import ProfileWindow
from jobsight.agent.training.run_records import TrainingRun, json_safe, open_run, warn_rank_zero

PROFILABLE = ("torch", "tensorflow", "jax")


class JobsightCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Telemetry for ``model.fit``; see the module docstring.

    ``metrics_every_n_batches``: how often batch logs are sent as metrics (epoch logs,
    validation included, are always sent). ``settings``: explicit agent settings.
    """

    def __init__(
        self,
        *,
        profile_epoch: int | None = None,
        profile_dir: str | None = None,
        profile_options: ProfileOptions | None = None,
        metrics_every_n_batches: int = 10,
        on_demand: bool = True,
        logs: bool = True,
        settings: AgentSettings | None = None,
        demo: bool = False,
        run_name: str | None = None,
        flush_timeout_s: float = 2.0,
    ) -> None:
        super().__init__()
        if profile_epoch is not None and (isinstance(profile_epoch, bool) or not isinstance(profile_epoch, int)
                                          or profile_epoch < 0):
            raise ValueError(f"profile_epoch must be a non-negative int (0 is the first epoch), not {profile_epoch!r}")
        if metrics_every_n_batches < 1:
            raise ValueError("metrics_every_n_batches must be >= 1")
        self.backend = keras.backend.backend()
        self.profile_epoch = profile_epoch
        if profile_epoch is not None and self.backend not in PROFILABLE:
            warn_rank_zero(None, f"jobsight: cannot profile the Keras {self.backend!r} backend "
                                 f"(only {', '.join(PROFILABLE)}); profile_epoch={profile_epoch} is ignored")
            self.profile_epoch = None
        self._profile_dir = profile_dir
        self._options = profile_options or ProfileOptions()
        self._every = metrics_every_n_batches
        self._on_demand = on_demand
        self._logs = logs
        self._settings = settings
        self._demo = demo
        self._run_name = run_name
        self._flush_timeout_s = flush_timeout_s
        self._run: TrainingRun | None = None
        self._epoch = 0
        self._batches = 0
        self._epoch_start = 0.0
        self._last_end = 0.0
        self._batch_start = 0.0
        self._wait = 0.0
        self._val_start = 0.0
        self._profile_first = 0
        self._window: ProfileWindow | None = None
        self._native_dir: str | None = None
        self._failed = False
        self.profiled_epochs: list[int] = []

    @property
    def run(self) -> TrainingRun | None:
        return self._run

    def _warn(self, message: str) -> None:
        rank = self._run.recorder.rank if self._run is not None else None
        warn_rank_zero(rank, message)

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        if self._run is not None:
            return
        try:
            self._run = open_run(
                settings=self._settings, rank=None, schedule=None, ranks=None, options=self._options,
                on_demand=self._on_demand, attach_logs=self._logs,
                extra={"framework": "keras", "backend": self.backend},
            )
            run = self._run
            params = dict(self.params or {})
            model = self.model
            meta = {
                "framework": "keras", "keras_version": keras.__version__, "backend": self.backend,
                "params": json_safe(params), "model": getattr(model, "name", None),
                "parameters": int(model.count_params()) if model is not None and model.built else None,
                "dtype_policy": str(getattr(getattr(model, "dtype_policy", None), "name", None)),
            }
            if not run.recorder.rank:
                run.recorder.run_started(demo=self._demo, name=self._run_name, attrs={"run": meta})
            run.recorder.event("fit started", event="fit_start", backend=self.backend)
            run.profiling.begin(0)
        except Exception as exc:  # noqa: BLE001 - boundary: no telemetry rather than no training
            self._run = None
            self._warn(f"jobsight: telemetry is off for this run ({exc!r})")

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        self._stop_profile()
        try:
            run.recorder.event("fit finished", event="fit_end", batches=self._batches)
        finally:
            run.close(self._flush_timeout_s)

    # -- epochs and batches --------------------------------------------------------------------

    def on_epoch_begin(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        self._epoch = epoch
        self._epoch_start = self._last_end = time.perf_counter()
        if epoch == self.profile_epoch and self._run is not None:
            self._start_profile(epoch)
            self._epoch_start = self._last_end = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        run = self._run
        if run is None:
            return
        duration = time.perf_counter() - self._epoch_start
        if self._window is not None or self._native_dir is not None:
            self._stop_profile()
        try:
            run.recorder.metrics(dict(logs or {}), self._batches)
            run.recorder.event(
                f"epoch {epoch} ended", event="epoch_end", epoch=epoch, duration_s=round(duration, 6),
                batches=self._batches,
            )
        except Exception as exc:  # noqa: BLE001 - boundary: telemetry never fails the fit
            self._warn(f"jobsight: epoch hook failed ({exc!r})")

    def on_train_batch_begin(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        now = time.perf_counter()
        self._wait = now - self._last_end
        self._batch_start = now

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        now = time.perf_counter()
        run = self._run
        if run is None:
            return
        try:
            compute = now - self._batch_start
            run.recorder.step(
                self._batches, self._wait + compute, epoch=self._epoch, data_wait_s=self._wait, compute_s=compute
            )
            self._batches += 1
            if logs and self._batches % self._every == 0:
                run.recorder.metrics(dict(logs), self._batches)
            window = self._window
            if window is not None:
                window.step()
            else:
                run.profiling.after_step(self._batches)
        except Exception as exc:  # noqa: BLE001 - boundary: telemetry never fails the fit
            if not self._failed:
                self._failed = True
                self._warn(f"jobsight: batch hook failed ({exc!r})")
        self._last_end = time.perf_counter()

    def on_test_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        self._val_start = time.perf_counter()

    def on_test_end(self, logs: Mapping[str, Any] | None = None) -> None:
        run = self._run
        if run is not None:
            run.recorder.event(
                "validation ended", event="validation_end", epoch=self._epoch,
                duration_s=round(time.perf_counter() - self._val_start, 6),
            )

    # -- the profiled epoch ----------------------------------------------------------------------

    def _start_profile(self, epoch: int) -> None:
        run = self._run
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
        run = self._run
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
