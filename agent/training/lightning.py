"""PyTorch Lightning: a thin callback over :mod:`~jobsight.agent.training.run_records` and
:mod:`~jobsight.agent.training.profiling`.

The two lines::

    from jobsight.agent.training.lightning import JobsightCallback
    trainer = Trainer(..., callbacks=[JobsightCallback()])     # profile=True for a window

Records: run metadata at fit start (hyper-parameters, world size, rank, devices,
precision), one ``step`` per training batch (data wait = time from the previous
batch's end to this batch's start, which is where Lightning fetches the batch;
compute = the batch hooks' span), logged metrics at the trainer's logging cadence
and at epoch/validation ends, epoch, validation and checkpoint events, and the
exception with its traceback. Step numbers count training batches on this rank.

Configuration is checked in ``__init__`` and fails there; after that no hook
raises (a failure is warned about once, on rank zero).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from jobsight.agent.settings import AgentSettings
from jobsight.agent.training.profile_schedule import ProfileOptions, ProfileSchedule, as_schedule, check_ranks
from jobsight.agent.training.run_records import TrainingRun, batch_size, json_safe, open_run, warn_rank_zero

F = TypeVar("F", bound=Callable[..., None])


def _quiet(hook: F) -> F:
    @functools.wraps(hook)
    def wrapper(self: JobsightCallback, *args: Any, **kwargs: Any) -> None:
        try:
            hook(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - boundary: a telemetry hook never fails the fit
            if not self._hook_failed:
                self._hook_failed = True
                rank = self._run.recorder.rank if self._run is not None else None
                warn_rank_zero(rank, f"jobsight: {hook.__name__} failed ({exc!r}); telemetry may be incomplete")

    return cast(F, wrapper)


def _logged(trainer: pl.Trainer) -> Mapping[str, Any]:
    """What ``self.log`` produced: the loggers' metrics, or without a logger the callback metrics."""
    return trainer.logged_metrics if trainer.loggers else trainer.callback_metrics


class JobsightCallback(Callback):
    """Telemetry for a Lightning fit.

    ``profile``: ``True`` for the default schedule, a :class:`ProfileSchedule` or its fields
    as a dict; off by default. ``profile_ranks``: ranks that profile (``None``: all).
    ``on_demand``: poll the collector for profile requests. ``logs``: attach the log handler
    to the root logger. ``settings``: explicit agent settings (default: the environment).
    ``demo``/``run_name`` label the job.
    """

    def __init__(
        self,
        *,
        profile: bool | ProfileSchedule | Mapping[str, int] | None = None,
        profile_ranks: Sequence[int] | None = (0,),
        profile_options: ProfileOptions | None = None,
        on_demand: bool = True,
        logs: bool = True,
        settings: AgentSettings | None = None,
        demo: bool = False,
        run_name: str | None = None,
        flush_timeout_s: float = 2.0,
    ) -> None:
        super().__init__()
        self._schedule = as_schedule(profile)
        self._ranks = check_ranks(profile_ranks)
        self._options = profile_options or ProfileOptions()
        if flush_timeout_s < 0:
            raise ValueError("flush_timeout_s must be >= 0")
        self._on_demand = on_demand
        self._logs = logs
        self._settings = settings
        self._demo = demo
        self._run_name = run_name
        self._flush_timeout_s = flush_timeout_s
        self._run: TrainingRun | None = None
        self._hook_failed = False
        self._batches = 0
        self._last_end = 0.0
        self._batch_start = 0.0
        self._wait = 0.0
        self._epoch_start = 0.0
        self._val_start = 0.0
        self._log_every = 50

    @property
    def run(self) -> TrainingRun | None:
        return self._run

    # -- set-up and tear-down ------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._run is not None:
            return
        try:
            extra = {"framework": "lightning", "precision": str(trainer.precision)}
            self._run = open_run(
                settings=self._settings, rank=trainer.global_rank, schedule=self._schedule, ranks=self._ranks,
                options=self._options, on_demand=self._on_demand, attach_logs=self._logs, extra=extra,
            )
        except Exception as exc:  # noqa: BLE001 - boundary: no telemetry rather than no training
            warn_rank_zero(trainer.global_rank, f"jobsight: telemetry is off for this run ({exc!r})")

    @_quiet
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        run = self._run
        if run is None:
            return
        import torch

        meta = {
            "framework": "lightning",
            "lightning_version": getattr(pl, "__version__", None),
            "torch_version": torch.__version__,
            "hparams": json_safe(dict(pl_module.hparams)),
            "world_size": trainer.world_size,
            "num_nodes": trainer.num_nodes,
            "devices": trainer.num_devices,
            "accelerator": type(trainer.accelerator).__name__,
            "strategy": type(trainer.strategy).__name__,
            "precision": str(trainer.precision),
            "max_epochs": trainer.max_epochs,
            "accumulate_grad_batches": trainer.accumulate_grad_batches,
            "parameters": sum(p.numel() for p in pl_module.parameters()),
            "model": type(pl_module).__name__,
        }
        if trainer.global_rank == 0:
            run.recorder.run_started(demo=self._demo, name=self._run_name, attrs={"run": meta})
        device = str(pl_module.device)
        run.recorder.event(
            f"fit started on rank {trainer.global_rank} of {trainer.world_size} ({device})",
            event="fit_start", rank=trainer.global_rank, local_rank=trainer.local_rank, device=device,
            **{k: meta[k] for k in ("world_size", "devices", "precision")},
        )

    @_quiet
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log_every = max(int(getattr(trainer, "log_every_n_steps", 50) or 1), 1)
        if self._run is not None:
            self._run.profiling.begin(self._batches)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        try:
            run.recorder.event(f"{stage} finished", event=f"{stage}_end", batches=self._batches)
        finally:
            run.close(self._flush_timeout_s)

    @_quiet
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        run = self._run
        if run is None:
            return
        run.recorder.event(
            f"training failed: {type(exception).__name__}: {exception}", level="ERROR", exception=exception,
            event="exception", step=self._batches, epoch=trainer.current_epoch,
        )
        run.profiling.close()
        run.recorder.flush(self._flush_timeout_s)

    # -- steps ---------------------------------------------------------------------------

    @_quiet
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_start = self._last_end = time.perf_counter()

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        self._wait = now - self._last_end
        self._batch_start = now

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        run = self._run
        if run is None:
            return
        try:
            compute = now - self._batch_start
            run.recorder.step(
                self._batches, self._wait + compute, epoch=trainer.current_epoch, data_wait_s=self._wait,
                compute_s=compute, samples=batch_size(batch),
            )
            self._batches += 1
            if self._batches % self._log_every == 0:
                run.recorder.metrics(_logged(trainer), trainer.global_step)
            run.profiling.after_step(self._batches)
        except Exception as exc:  # noqa: BLE001 - boundary: a telemetry hook never fails the fit
            if not self._hook_failed:
                self._hook_failed = True
                warn_rank_zero(run.recorder.rank, f"jobsight: step hook failed ({exc!r})")
        self._last_end = time.perf_counter()

    @_quiet
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        run = self._run
        if run is None:
            return
        run.recorder.metrics(_logged(trainer), trainer.global_step)
        run.recorder.event(
            f"epoch {trainer.current_epoch} ended", event="epoch_end", epoch=trainer.current_epoch,
            duration_s=round(time.perf_counter() - self._epoch_start, 6), batches=self._batches,
        )

    # -- validation and checkpoints ------------------------------------------------------------

    @_quiet
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._val_start = time.perf_counter()

    @_quiet
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        run = self._run
        if run is None or trainer.sanity_checking:
            return
        duration = time.perf_counter() - self._val_start
        run.recorder.metrics(_logged(trainer), trainer.global_step)
        run.recorder.event(
            f"validation after epoch {trainer.current_epoch} took {duration:.2f} s", event="validation_end",
            epoch=trainer.current_epoch, duration_s=round(duration, 6), step=self._batches,
        )
        # The time validation took is not the next batch's data wait.
        self._last_end = time.perf_counter()

    @_quiet
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        run = self._run
        if run is None or trainer.global_rank != 0:
            return
        run.recorder.event(
            f"checkpoint saved at epoch {trainer.current_epoch}, step {trainer.global_step}", event="checkpoint",
            epoch=trainer.current_epoch, global_step=trainer.global_step,
        )
