"""Diagnoses that name the cause: the user's line behind a Python loop, the straggling rank
behind the others' waiting, and no loop hint for what a framework does inside."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from jobsight.agent.training.lightning import JobsightCallback  # noqa: E402
from jobsight.protocol.diagnosis import Thresholds, diagnose  # noqa: E402
from tests.frameworks.lightning_ddp_run import run_lightning_ddp  # noqa: E402
from tests.frameworks.support import agent_settings, api, rows, wait_for  # noqa: E402
from tests.frameworks.test_lightning import trainer  # noqa: E402

F = torch.nn.functional
VOCAB, SEQ, BATCH = 32, 128, 4


class PerTokenLoss(pl.LightningModule):  # type: ignore[misc]
    """A tiny language model whose loss is summed token by token in a Python loop."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, VOCAB)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        (tokens,) = batch
        logits = self.head(self.embed(tokens[:, :-1]))
        loss = torch.zeros(())
        for t in range(SEQ):
            loss = loss + F.cross_entropy(logits[:, t], tokens[:, t + 1])
        return loss / SEQ

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _line_of(text: str) -> int:
    lines, first = inspect.getsourcelines(PerTokenLoss.training_step)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _hints(hints: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {hint["rule"]: hint for hint in hints}


def test_a_per_token_loss_loop_is_named_by_its_line_and_loss_function(
    live_collector: Any, job_id: str, tmp_path: Path
) -> None:
    callback = JobsightCallback(profile={"wait": 1, "warmup": 1, "active": 2}, on_demand=False,
                                settings=agent_settings(live_collector, job_id, tmp_path))
    tokens = torch.randint(0, VOCAB, (6 * BATCH, SEQ + 1), generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens), batch_size=BATCH)
    trainer(callback, tmp_path, epochs=1).fit(PerTokenLoss(), loader)

    profile = wait_for(lambda: api(live_collector, f"/v1/jobs/{job_id}/profiles")["profiles"])[0]
    call_line, loop_line = _line_of("F.cross_entropy("), _line_of("for t in range(SEQ)")
    site = f"{Path(__file__).name}:{call_line} cross_entropy"
    loop = _hints(profile["diagnosis"])["python_loop"]
    assert loop["message"].startswith(site), loop["message"]
    evidence = loop["evidence"]
    assert (evidence["file"], evidence["line"], evidence["loop_line"]) == (Path(__file__).name, call_line, loop_line)
    assert evidence["calls"] == "cross_entropy" and evidence["function"] == "training_step"
    assert evidence["calls_per_step"] == SEQ and evidence["line_exact"] is True
    # The job's diagnosis carries the rank's hint as stored.
    job_hints = _hints(api(live_collector, f"/v1/jobs/{job_id}/diagnosis")["hints"])
    assert job_hints["python_loop"]["evidence"]["site"] == evidence["site"]


def test_a_slow_rank_is_named_a_straggler_not_communication_bound(
    live_collector: Any, db: Any, job_id: str, tmp_path: Path
) -> None:
    run_lightning_ddp(live_collector, job_id, tmp_path, slow_rank=1, extra_s=0.08)
    profiles = wait_for(lambda: (p := api(live_collector, f"/v1/jobs/{job_id}/profiles")["profiles"])
                        and len(p) == 2 and p)
    shares = {p["rank"]: p["summary"]["breakdown"]["communication_share"] for p in profiles}
    assert shares[0] > 2 * shares[1], shares  # rank 0 waits for rank 1 in the all-reduce

    diagnosis = api(live_collector, f"/v1/jobs/{job_id}/diagnosis")
    hints = _hints(diagnosis["hints"])
    assert "communication_bound" not in hints, hints
    straggler = hints["straggler"]
    assert straggler["evidence"]["rank"] == 1 and straggler["title"] == "Rank 1 is a straggler"
    assert straggler["evidence"]["communication_share_by_rank"] == {"0": shares[0], "1": shares[1]}
    assert f"{100 * shares[1]:.0f}%" in straggler["message"] and f"{100 * shares[0]:.0f}%" in straggler["message"]

    # The step rule sees it too, from each rank's own work (data wait + forward): the step
    # times themselves are alike, as rank 0 waits for rank 1 at every step.
    steps = rows(db, "SELECT rank, duration_s, data_wait_s, forward_s FROM steps WHERE job_id = %s", job_id)
    fields = ("rank", "duration_s", "data_wait_s", "forward_s")
    by_steps = _hints(diagnose(steps=[dict(zip(fields, s, strict=True)) for s in steps]))
    assert by_steps["straggler"]["evidence"]["rank"] == 1
    assert by_steps["straggler"]["evidence"]["quantity"] == "data_wait_s + forward_s"
    durations = [{"rank": s[0], "duration_s": s[1]} for s in steps]
    assert "straggler" not in _hints(diagnose(steps=durations))


def test_a_healthy_keras_run_gets_no_loop_hint(live_collector: Any, job_id: str, tmp_path: Path) -> None:
    # test_keras first: it picks the torch backend before Keras is imported, and skips without Keras.
    from tests.frameworks.test_keras import fit  # noqa: I001
    from jobsight.agent.training.keras import JobsightCallback as KerasCallback

    fit(KerasCallback(profile_epoch=2, on_demand=False, settings=agent_settings(live_collector, job_id, tmp_path)))
    profile = wait_for(lambda: api(live_collector, f"/v1/jobs/{job_id}/profiles")["profiles"])[0]
    summary = profile["summary"]
    # Keras calls ops many times per step itself (moving its variables): they have no user line,
    # so even at a threshold they reach (the old rule's false alarm) the loop hint stays quiet.
    busiest = summary["most_called"][0]
    assert summary["stacks"] is True and busiest["source"] is None, busiest
    reached = Thresholds(loop_calls_per_step=busiest["calls_per_step"])
    assert "python_loop" not in _hints(diagnose(profile=summary, thresholds=reached))
    assert "python_loop" not in _hints(profile["diagnosis"])
    assert "python_loop" not in _hints(api(live_collector, f"/v1/jobs/{job_id}/diagnosis")["hints"])
