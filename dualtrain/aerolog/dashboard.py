"""`DashBoard`: live progress and metrics for a training loop, and its logs (Nebulae's Aerolog).

``gauge`` never forces a device sync per step: a torch or JAX scalar is kept as it is and
read with the others every `interval` steps (and at an epoch's end, `read` and `log`), so
the device runs ahead between reads as it would without a dashboard.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dualtrain.accelerate.dispatch import deciding_seconds
from dualtrain.aerolog.book import MetricBook, Point
from dualtrain.aerolog.files import (
    POINT_HEADER,
    append_record,
    check_file,
    check_folder,
    curve_paths,
    write_curves,
    write_epochs,
    write_points,
)
from dualtrain.aerolog.formats import Formats
from dualtrain.aerolog.values import kept, value_of
from dualtrain.aerolog.views import Frame, LiveView, PlainView
from dualtrain.errors import ArgumentError, bad_argument
from dualtrain.multiverse.world import from_environment
from dualtrain.validate import check_finite, check_int

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["DashBoard"]


class DashBoard:
    """Progress, metrics and curves of a training loop; CSV and PNG logs.

    Args:
        log_path: the folder `log` writes to (made when first written). Checked here: a
            file there, a file on the way, or an unwritable parent is an ArgumentError.
        window: steps in each metric's moving average (>= 1).
        divisor: rows of the terminal curve (>= 2).
        span: points across the terminal curve (>= 2).
        format: ``{key: (fmt, mode)}``, mode 'raw' | 'percent' | 'tailor' | 'inviz' (see
            `dualtrain.aerolog.formats`); other keys raw ``'.4g'``.
        curve: the metric drawn as a curve (default: the first one gauged).
        rank: this process's rank; only rank 0 draws and writes (default: the launcher's,
            read as Multiverse reads it: torchrun's, SLURM's or Multiverse's variables;
            0 outside a launcher).
        console: a rich Console to draw on (default: stdout's). Off a terminal the dashboard
            prints plain lines.
        clock: seconds, as `time.perf_counter` (the default) reads them: what times steps,
            data waits and epochs. A seam for tests, which pass a fake clock so that what is
            shown does not depend on how busy the machine is.
    """

    def __init__(
        self,
        log_path: str | os.PathLike[str] = "./aerolog",
        window: int = 1,
        divisor: int = 10,
        span: int = 30,
        format: Mapping[str, Any] | None = None,
        *,
        curve: str | None = None,
        rank: int | None = None,
        console: Console | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.window = check_int("window", window, 1)
        self.divisor = check_int("divisor", divisor, 2)
        self.span = check_int("span", span, 2)
        # Checked now, not at the first `log` (a file there once failed late, bare).
        path = check_folder("log_path", log_path)
        self.formats = Formats(format)
        if curve is not None and not isinstance(curve, str):
            raise bad_argument("curve", curve, "None or a metric name")
        if not callable(clock):
            raise bad_argument(
                "clock", clock, "a callable returning seconds, like time.perf_counter"
            )
        self.log_path = path
        self.rank = _rank(rank)
        self.book = MetricBook(self.window)
        if console is None:
            from rich.console import Console

            console = Console()
        self.console = console
        self._clock = clock
        self._curve = curve
        self._pending: list[tuple[Point, Any]] = []
        self._stages: dict[str, _StageClock] = {}
        self._frames: dict[str, Frame] = {}
        self._view: LiveView | PlainView | None = None
        self._data_wait = 0.0
        self._deciding_seen = deciding_seconds()  # the ladders' deciding, shown apart
        self._last: float | None = None  # the previous gauge, of any stage

    def __enter__(self) -> DashBoard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Reads what is pending and stops the live display (its last frame stays)."""
        self._flush()
        if self._view is not None:
            self._view.close()

    # ---- gauging -------------------------------------------------------------------------

    def gauge(
        self,
        entry: Mapping[str, Any],
        mile: int,
        epoch: int,
        mpe: int,
        stage: str,
        interval: int = 1,
        duration: float | None = None,
        *,
        samples: int | None = None,
    ) -> None:
        """Notes one step's metrics; draws every step, reads values every `interval` steps.

        Args:
            entry: metric name -> value: a Python or NumPy number, or a one-element torch
                tensor or JAX array (kept unread until the next read).
            mile: the step within the epoch, 1..mpe.
            epoch: the epoch (any int; the dashboard does not count them).
            mpe: steps per epoch ("miles per epoch").
            stage: 'train', 'test', ...: each stage has its own bar, means and curves.
            interval: read and show values when ``mile % interval == 0`` and at the epoch's
                last step.
            duration: this step's seconds, if the caller timed it (default: the time since
                this stage's previous gauge).
            samples: rows in this step, for samples/s (default: steps/s only).
        """
        self._check(entry, mile, epoch, mpe, stage, interval, duration, samples)
        values = [(str(key), kept(f"entry[{key!r}]", v)) for key, v in entry.items()]
        now = self._clock()
        clock = self._stages.get(stage)
        if clock is None:
            clock = self._stages[stage] = _StageClock(now)
        if clock.epoch != epoch:  # the epoch's time runs from the gauge before its first step
            clock.epoch, clock.epoch_started = epoch, now if self._last is None else self._last
        # A step's time: since the previous gauge of any stage (the first step has none).
        step = (
            duration if duration is not None else None if self._last is None else now - self._last
        )
        self._last = now
        clock.tick(step, samples, self._take_data_wait(), self._take_deciding())
        for key, value in values:
            self._pending.append((Point(stage, key, epoch, mile, mpe, 0.0), value))
        last = mile == mpe
        read = last or mile % interval == 0
        if read:
            self._flush()
        frame = self._frame(stage, epoch, mile, mpe, clock, read or stage not in self._frames)
        if self._view is None and self.rank == 0:
            terminal = self.console.is_terminal and not self.console.is_dumb_terminal
            self._view = LiveView(self.console, self.span, self.divisor) if terminal else (
                PlainView(self.console)
            )  # fmt: skip
            self._finalizer = weakref.finalize(self, self._view.close)
        if self._view is not None:
            self._view.show(frame, read)
            if last:
                self._view.epoch_end(self._summary(stage, epoch, clock))

    def feed(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Yields from `iterable`, timing each wait for the next item as data wait.

        ``for batch in dash.feed(tank): ...; dash.gauge(...)`` splits each step's time into
        data wait and compute.
        """
        iterator = iter(iterable)
        while True:
            started = self._clock()
            try:
                item = next(iterator)
            except StopIteration:
                return
            self._data_wait += self._clock() - started
            yield item

    def read(self, key: str, stage: str, epoch: int = -1) -> float:
        """`key`'s mean over the steps of `stage` gauged in `epoch` (-1: the latest).

        Raises:
            ArgumentError: nothing gauged for that key, stage and epoch.
        """
        self._flush()
        means = self.book.epoch_means(stage, key)
        if epoch == -1 and means:
            epoch = max(means)
        if epoch not in means:
            raise ArgumentError(
                f"nothing gauged for key {key!r} in stage {stage!r} at epoch {epoch}; "
                f"gauged: {sorted(f'{s}:{k}' for s, k in self.book.slots())}"
            )
        return means[epoch]

    # ---- logs ----------------------------------------------------------------------------

    def log(self, gauge: bool = True, tachograph: bool = True, record: str = "") -> list[Path]:
        """Writes the logs into `log_path` (rank 0 only); returns the files written.

        Args:
            gauge: a PNG per metric (``<key>.png``): each stage's moving mean and epoch means.
            tachograph: ``metrics.csv`` (every point) and ``epochs.csv`` (epoch means).
            record: a file name (in `log_path`, or a path) to which the points gauged since
                the last record are appended: one running file across runs.

        Each file is written to a temporary name and renamed: an interrupted `log` leaves
        the previous files whole.
        """
        if not isinstance(record, (str, os.PathLike)):
            raise bad_argument("record", record, "'' or a file name")
        self._flush()
        if self.rank != 0:
            return []
        # Every target checked before the first is written: a bad one leaves all as it was.
        check_folder("log_path", self.log_path)
        if record:
            check_file("record", self.log_path / record, record, POINT_HEADER)
            check_folder("record", (self.log_path / record).parent)
        targets = (
            [self.log_path / "metrics.csv", self.log_path / "epochs.csv"] if tachograph else []
        )
        targets += curve_paths(self.book, self.log_path) if gauge else []
        for target in targets:
            check_file("log_path", target, self.log_path)
        self.log_path.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        if tachograph:
            write_points(self.book, self.log_path / "metrics.csv")
            write_epochs(self.book, self.log_path / "epochs.csv")
            written += [self.log_path / "metrics.csv", self.log_path / "epochs.csv"]
        if record:
            path = self.log_path / record
            path.parent.mkdir(parents=True, exist_ok=True)
            append_record(self.book, path)
            written.append(path)
        if gauge:
            written += write_curves(self.book, self.log_path)
        return written

    # ---- inside --------------------------------------------------------------------------

    def _check(
        self, entry: Any, mile: Any, epoch: Any, mpe: Any, stage: Any, interval: Any,
        duration: Any, samples: Any,
    ) -> None:  # fmt: skip
        if not isinstance(entry, Mapping):
            raise bad_argument("entry", entry, "a dict {metric name: value}")
        mpe = check_int("mpe", mpe, 1)
        check_int("mile", mile, 1, mpe)
        check_int("epoch", epoch)
        if not isinstance(stage, str) or not stage:
            raise bad_argument("stage", stage, "a stage name such as 'train'")
        check_int("interval", interval, 1)
        if duration is not None:
            check_finite("duration", duration, 0, expected="None or seconds >= 0")
        if samples is not None:
            check_int("samples", samples, 0)

    def _take_data_wait(self) -> float:
        wait, self._data_wait = self._data_wait, 0.0
        return wait

    def _take_deciding(self) -> float:
        # What accelerate's ladders spent deciding since the previous gauge (a compile in
        # the middle of a job): shown apart, so step times stay what the steps cost.
        now = deciding_seconds()
        spent, self._deciding_seen = now - self._deciding_seen, now
        return spent

    def _flush(self) -> None:
        """Reads every pending value (the only host reads of device scalars)."""
        pending, self._pending = self._pending, []
        for point, value in pending:
            number = value_of(value)
            done = Point(point.stage, point.key, point.epoch, point.mile, point.mpe, number)
            self.book.add(done)
            self.formats.notify(done.key, done.stage, done.epoch, done.mile, done.mpe, number)

    def _frame(
        self, stage: str, epoch: int, mile: int, mpe: int, clock: _StageClock, read: bool
    ) -> Frame:
        """The stage's frame: metrics, speed and curve change on reads only; the bar always."""
        if not read:
            last = self._frames[stage]
            frame = Frame(stage, epoch, mile, mpe, last.metrics, last.timing, last.curve,
                          last.curve_key)  # fmt: skip
            self._frames[stage] = frame
            return frame
        keys = [k for s, k in self.book.slots() if s == stage and not self.formats.hidden(k)]
        metrics = []
        for key in keys:
            value = self.book.moving(stage, key)
            if value is not None:
                metrics.append((key, self.formats.text(key, value)))
        curve_key = self._curve if self._curve is not None else (keys[0] if keys else "")
        curve = self.book.moving_series(stage, curve_key, self.span) if curve_key else []
        frame = Frame(stage, epoch, mile, mpe, metrics, clock.text(), curve, curve_key)
        self._frames[stage] = frame
        return frame

    def _summary(self, stage: str, epoch: int, clock: _StageClock) -> str:
        parts = [f"{stage} epoch {epoch} done"]
        for s, key in self.book.slots():
            if s == stage and not self.formats.hidden(key):
                means = self.book.epoch_means(stage, key)
                if epoch in means:
                    parts.append(f"{key} {self.formats.text(key, means[epoch])}")
        took = f"{self._last - clock.epoch_started:.1f} s" if self._last is not None else ""
        if clock.epoch_deciding > 0:
            took += f" (deciding {clock.epoch_deciding:.1f} s)"
        clock.epoch_deciding = 0.0
        parts.append(took)
        return " | ".join(parts)


class _StageClock:
    """One stage's step times since its last read: total, data wait, deciding, samples.

    Seconds the compile ladders spent deciding are taken out of the steps' time and shown
    apart (per read and per epoch).
    """

    def __init__(self, now: float) -> None:
        self.epoch_started = now
        self.epoch: int | None = None
        self.steps = 0
        self.seconds = self.wait = self.deciding = self.epoch_deciding = 0.0
        self.samples: int | None = None
        self.shown = ""

    def tick(self, step: float | None, samples: int | None, wait: float, deciding: float) -> None:
        self.epoch_deciding += deciding
        if step is None:
            return  # untimed: the run's first step
        deciding = min(deciding, max(float(step), 0.0))  # another clock's seconds: bounded
        self.steps += 1
        self.seconds += float(step) - deciding
        self.deciding += deciding
        self.wait += wait
        if samples is not None:
            self.samples = (self.samples or 0) + int(samples)

    def text(self) -> str:
        """Speed over the steps since the last call (kept until new steps come)."""
        if self.steps and self.seconds > 0:
            per_step = self.seconds / self.steps
            rate = (
                f"{self.samples / self.seconds:.1f} samples/s"
                if self.samples is not None
                else f"{self.steps / self.seconds:.2f} steps/s"
            )
            split = ""
            if self.wait > 0:
                wait = self.wait / self.steps
                split = f" (data {wait * 1e3:.1f} ms, compute {(per_step - wait) * 1e3:.1f} ms)"
            decided = f" | deciding {self.deciding:.1f} s" if self.deciding > 0 else ""
            self.shown = f"{rate} | step {per_step * 1e3:.1f} ms{split}{decided}"
            self.steps, self.seconds, self.wait, self.samples = 0, 0.0, 0.0, None
            self.deciding = 0.0
        return self.shown


def _rank(rank: Any) -> int:
    if rank is None:  # torchrun's, SLURM's or Multiverse's variables; 0 outside a launcher
        world = from_environment()
        return 0 if world is None else world.rank
    return check_int("rank", rank, 0)
