"""NeMo 1.x-style progress output on stdout and the same scalars in TensorBoard (every engine's log format).

A progress update looks like NeMo's (Lightning's TQDM bar with NeMo's metrics):

    Epoch 0: : 42%|████▏     | 21/50 [03:10<04:23, reduced_train_loss=1.230, global_step=20.00, consumed_samples=2688.0, train_step_timing in s=9.050]

Updates are separated by carriage returns and the bar ends with a newline, as TQDM writes to a
Slurm .out file. ``global_step`` is the 0-based step Lightning reports (n - 1 after n steps);
``consumed_samples`` counts the samples of the n steps done (n x GBS). Numbers use Lightning's
TQDM form (3 significant digits, padded to 5 characters, short exponents: ``2e+3``).
TensorBoard gets ``reduced_train_loss``, ``lr``, ``global_step``, ``consumed_samples`` and
``train_step_timing in s`` at step n - 1 in ``<run_dir>/logs``.
"""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

from vdkit.run.logformat import CONSUMED_SAMPLES_KEY, GLOBAL_STEP_KEY, LOSS_KEY, LR_KEY, TIMING_KEY

_PAD = 5  # lightning.pytorch.callbacks.progress.tqdm_progress._PAD_SIZE
_BLOCKS = " ▏▎▍▌▋▊▉█"
BAR_WIDTH = 10


def tqdm_num(x: float) -> str:
    """A number as Lightning's progress bar prints it (tqdm.format_num, then Lightning's padding)."""
    f = "{0:.3g}".format(x).replace("+0", "+").replace("-0", "-")
    n = str(x)
    s = f if len(f) < len(n) else n
    if isinstance(x, float) and "e" not in s:
        if "." not in s and len(s) < _PAD:
            s += "."
        s += "0" * (_PAD - len(s))
    return s


def _interval(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def _bar(frac: float) -> str:
    frac = min(max(frac, 0.0), 1.0)
    full, part = divmod(int(frac * BAR_WIDTH * 8), 8)
    bar = "█" * full + (_BLOCKS[part] if full < BAR_WIDTH else "")
    return bar.ljust(BAR_WIDTH)


def progress_line(epoch: int, n: int, total: int, elapsed: float, remaining: float, loss: float,
                  global_step: int, consumed: int, timing: float, lr: Optional[float] = None) -> str:
    """One NeMo 1.x progress update (no separators)."""
    metrics = [(LOSS_KEY, loss), (GLOBAL_STEP_KEY, float(global_step)),
               (CONSUMED_SAMPLES_KEY, float(consumed)), (TIMING_KEY, timing)]
    if lr is not None:
        metrics.insert(1, (LR_KEY, lr))
    post = ", ".join(f"{k}={tqdm_num(float(v))}" for k, v in metrics)
    pct = 100.0 * n / total if total else 0.0
    return (f"Epoch {epoch}: : {pct:.0f}%|{_bar(n / total if total else 0)}| {n}/{total} "
            f"[{_interval(elapsed)}<{_interval(remaining)}, {post}]")


class ProgressLogger:
    """Rank 0's progress bar (stdout) and TensorBoard writer for one run of the loop."""

    def __init__(self, log_dir, total_steps: int, start_step: int, stream: TextIO = None, tensorboard: bool = True):
        self.total, self.start = total_steps, start_step
        self.stream = stream or sys.stdout
        self.t0 = time.perf_counter()
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(log_dir), flush_secs=10)
        self.open = False

    def update(self, epoch: int, n: int, loss: float, lr: float, consumed: int, timing: float) -> None:
        """Log optimizer step number ``n`` (1-based) that has just finished."""
        elapsed = time.perf_counter() - self.t0
        done = n - self.start
        remaining = elapsed / done * (self.total - n) if done > 0 else 0.0
        line = progress_line(epoch, n, self.total, elapsed, remaining, loss, n - 1, consumed, timing)
        self.stream.write("\r" + line)  # TQDM: each update starts with a carriage return
        self.stream.flush()
        self.open = True
        if self.writer is not None:
            for key, value in ((LOSS_KEY, loss), (LR_KEY, lr), (GLOBAL_STEP_KEY, float(n - 1)),
                               (CONSUMED_SAMPLES_KEY, float(consumed)), (TIMING_KEY, timing)):
                self.writer.add_scalar(key, value, n - 1)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def message(self, text: str) -> None:
        """A log record on its own line (ends the current bar line first)."""
        self.stream.write(("\n" if self.open else "") + text + "\n")
        self.stream.flush()
        self.open = False

    def close(self) -> None:
        if self.open:
            self.stream.write("\n")
            self.stream.flush()
            self.open = False
        if self.writer is not None:
            self.writer.close()
