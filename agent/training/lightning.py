"""PyTorch Lightning: a thin callback over :mod:`~jobsight.agent.training.run_records` and
:mod:`~jobsight.agent.training.profiling`.

The two lines::

    from jobsight.agent.training.lightning import JobsightCallback
    trainer = Trainer(..., callbacks=[JobsightCallback()])     # profile=True for a window

Records: run metadata at fit start (hyper-parameters, world size, rank, devices,
precision), one ``step`` per training batch (data wait = time from the previous
batch's end to this batch's start, which is where Lightning fetches the batch;
compute = the batch hooks' span, forward = batch start to backward start), the phase
each pending step is in (data, forward, backward, optimizer, validation: sent only when
one lasts long, ``step_watch``), logged
metrics at the trainer's logging cadence and at epoch/validation ends, epoch, validation and checkpoint events, and the
exception with its traceback. Step numbers count training batches on this rank.

Configuration is checked in ``__init__`` and fails there; after that no hook
raises (a failure is warned about once, on rank zero).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, Unpack, cast

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from jobsight.agent.training.fit_telemetry import CallbackKeywords, CallbackOptions, FitTelemetry
from jobsight.agent.training.profile_schedule import ProfileOptions, ProfileSchedule, as_schedule, check_ranks
from jobsight.agent.training.run_records import TrainingRun, batch_size
from jobsight.protocol.json_safe import json_safe
from jobsight.protocol.run_events import EXCEPTION
from jobsight.protocol.step_phases import FORWARD

F = TypeVar("F", bound=Callable[..., None])


def _quiet(hook: F) -> F:
    @functools.wraps(hook)
    def wrapper(self: JobsightCallback, *args: Any, **kwargs: Any) -> None:
        try:
            hook(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - boundary: a telemetry hook never fails the fit
            self._telemetry.warn_once(hook.__name__, exc)

    return cast(F, wrapper)


def _logged(trainer: pl.Trainer) -> Mapping[str, Any]:
    """What ``self.log`` produced: the loggers' metrics, or without a logger the callback metrics."""
    return trainer.logged_metrics if trainer.loggers else trainer.callback_metrics


class JobsightCallback(Callback):
    """Telemetry for a Lightning fit.

    ``profile``: ``True`` for the default schedule, a :class:`ProfileSchedule` or its fields
    as a dict; off by default. ``profile_ranks``: ranks that profile (``None``: all).
    ``options``: :class:`~jobsight.agent.training.fit_telemetry.CallbackOptions` (on_demand, logs,
    settings, demo, run_name, flush_timeout_s).
    """

    def __init__(
        self,
        *,
        profile: bool | ProfileSchedule | Mapping[str, int] | None = None,
        profile_ranks: Sequence[int] | None = (0,),
        profile_options: ProfileOptions | None = None,
        **options: Unpack[CallbackKeywords],
    ) -> None:
        super().__init__()
        self._schedule = as_schedule(profile)
        self._ranks = check_ranks(profile_ranks)
        self._options = profile_options or ProfileOptions()
        self._telemetry = FitTelemetry(CallbackOptions(**options))
        self._log_every = 50

    @property
    def run(self) -> TrainingRun | None:
        return self._telemetry.run

    # -- set-up and tear-down ------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._telemetry.open(
            rank=trainer.global_rank, schedule=self._schedule, ranks=self._ranks, profile_options=self._options,
            extra={"framework": "lightning", "precision": str(trainer.precision)},
        )

    @_quiet
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._telemetry.run is None:
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
        device = str(pl_module.device)
        self._telemetry.started(
            meta, f"fit started on rank {trainer.global_rank} of {trainer.world_size} ({device})",
            rank=trainer.global_rank, local_rank=trainer.local_rank, device=device,
            **{k: meta[k] for k in ("world_size", "devices", "precision")},
        )

    @_quiet
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log_every = max(int(getattr(trainer, "log_every_n_steps", 50) or 1), 1)
        if self._telemetry.run is not None:
            self._telemetry.run.profiling.begin(self._telemetry.batches)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # ``stage`` is a str enum whose str() is "TrainerFn.FITTING" in some Lightning versions.
        name = str(getattr(stage, "value", stage))
        self._telemetry.close(f"{name} finished", f"{name}_end")

    @_quiet
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        run = self._telemetry.run
        if run is None:
            return
        run.recorder.event(
            f"training failed: {type(exception).__name__}: {exception}", level="ERROR", exception=exception,
            event=EXCEPTION, step=self._telemetry.batches, epoch=trainer.current_epoch,
        )
        run.profiling.close()
        run.recorder.flush(self._telemetry.options.flush_timeout_s)

    # -- steps ---------------------------------------------------------------------------

    @_quiet
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._telemetry.epoch_started()

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._telemetry.batch_started(FORWARD)

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any) -> None:
        self._telemetry.backward_started()

    # on_before_optimizer_step needs no hook of its own: it follows this at once, and is skipped
    # on the steps of gradient accumulation, where backward is over all the same.
    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._telemetry.backward_ended()

    @_quiet
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        telemetry = self._telemetry
        try:
            run = telemetry.batch_ended(trainer.current_epoch, batch_size(batch))
            if run is not None:
                if telemetry.batches % self._log_every == 0:
                    run.recorder.metrics(_logged(trainer), trainer.global_step)
                run.profiling.after_step(telemetry.batches)
        finally:
            telemetry.between_steps()

    @_quiet
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._telemetry.epoch_ended(trainer.current_epoch, _logged(trainer), trainer.global_step)

    # -- validation and checkpoints ------------------------------------------------------------

    @_quiet
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._telemetry.validation_started()

    @_quiet
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._telemetry.validation_ended(trainer.current_epoch, _logged(trainer), trainer.global_step)

    @_quiet
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        run = self._telemetry.run
        if run is None or trainer.global_rank != 0:
            return
        run.recorder.event(
            f"checkpoint saved at epoch {trainer.current_epoch}, step {trainer.global_step}", event="checkpoint",
            epoch=trainer.current_epoch, global_step=trainer.global_step,
        )
