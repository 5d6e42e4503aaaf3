"""Step time with the Lightning callback (profiling off) against without, in the same run.

Prints both medians and their ratio; the target is <= 1.01 at a ~20 ms step. Runs
alternate (without, with, without, ...) so drift in the machine hits both alike.
Records go to a stub collector on loopback that acknowledges every batch, so the
shipper does its real work (gzip, HTTP) without a database.

    python bench/callback_overhead.py [--rounds 5] [--steps 100] [--width 1024]
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

# Run as a file, this folder comes first on sys.path, and bench/agent.py would shadow the agent package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if p and Path(p).resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))


class _Ack(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"status": "stored"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - directive polls
        body = json.dumps({"profile_requests": []}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--width", type=int, default=2048, help="hidden width; tune for a ~20 ms step")
    args = parser.parse_args()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ack)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    os.environ.update(JOBSIGHT_URL=f"http://127.0.0.1:{server.server_address[1]}", JOBSIGHT_TOKEN="bench",
                      JOBSIGHT_JOB_ID="bench-callback-overhead")

    import lightning.pytorch as pl
    import torch

    from jobsight.agent.training.lightning import JobsightCallback

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                           torch.nn.Linear(args.width, 1))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    x = torch.randn(args.steps * 64, args.width)
    data = torch.utils.data.TensorDataset(x, torch.randn(len(x), 1))
    loader = torch.utils.data.DataLoader(data, batch_size=64)

    class Clock(pl.Callback):
        """Wall time per step, the same way for both arms."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self._last = 0.0

        def on_train_batch_end(self, *a: Any) -> None:
            now = time.perf_counter()
            if self._last:
                self.times.append(now - self._last)
            self._last = now

    def arm(with_callback: bool) -> float:
        clock = Clock()
        callbacks: list[Any] = [clock] + ([JobsightCallback(logs=False)] if with_callback else [])
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=callbacks, logger=False,
                             enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                             log_every_n_steps=10)
        trainer.fit(Model(), loader)
        return statistics.median(clock.times[5:])

    arm(False)  # warm-up
    without: list[float] = []
    with_cb: list[float] = []
    for _ in range(args.rounds):
        without.append(arm(False))
        with_cb.append(arm(True))
    base, instrumented = statistics.median(without), statistics.median(with_cb)
    print(f"step time without callback: {base * 1000:.2f} ms (median of {args.rounds} runs)")
    print(f"step time with callback:    {instrumented * 1000:.2f} ms (profiling off)")
    print(f"ratio: {instrumented / base:.4f}  (target <= 1.01)")
    server.shutdown()


if __name__ == "__main__":
    main()
