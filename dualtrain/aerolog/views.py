"""What the dashboard shows: a live rich display on a terminal, plain lines elsewhere.

The live display redraws itself (rich ``Live``, 4 times a second) and takes over stdout and
stderr while it runs, so the program's own prints appear above it instead of breaking it.
Off a terminal (CI logs, files, pipes) each read prints one line, and each epoch's end one
summary line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dualtrain.aerolog.curve import curve_lines

if TYPE_CHECKING:  # rich is imported when a dashboard first draws (import dualtrain stays light)
    from rich.console import Console

__all__ = ["Frame", "LiveView", "PlainView"]


@dataclass
class Frame:
    """What one stage shows: where it is, its metrics as text, speed, and a curve."""

    stage: str
    epoch: int
    mile: int
    mpe: int
    metrics: list[tuple[str, str]] = field(default_factory=list)
    timing: str = ""
    curve: list[float] = field(default_factory=list)
    curve_key: str = ""

    def line(self) -> str:
        """The frame as one plain line."""
        parts = [f"{self.stage} epoch {self.epoch} {self.mile}/{self.mpe}"]
        parts += [f"{key} {text}" for key, text in self.metrics]
        if self.timing:
            parts.append(self.timing)
        return " | ".join(parts)


class PlainView:
    """One line per read, one per epoch end, on `console`'s file."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def show(self, frame: Frame, read: bool) -> None:
        """Prints `frame` when its values were just read (not on every step)."""
        if read:
            print(frame.line(), file=self.console.file, flush=True)

    def epoch_end(self, line: str) -> None:
        """Prints an epoch's summary."""
        print(line, file=self.console.file, flush=True)

    def close(self) -> None:
        """Nothing to stop."""


class LiveView:
    """A rich live display: progress bar, metrics, speed, and the curve of one metric."""

    def __init__(self, console: Console, span: int, divisor: int) -> None:
        self.console, self.span, self.divisor = console, span, divisor
        from rich.live import Live

        self.frame: Frame | None = None
        self._live = Live(
            get_renderable=self._render, console=console, refresh_per_second=4,
            redirect_stdout=True, redirect_stderr=True, transient=False,
        )  # fmt: skip
        self._started = False

    def show(self, frame: Frame, read: bool) -> None:
        """Makes `frame` the one drawn (the bar moves every step, metrics on reads)."""
        self.frame = frame
        if not self._started:
            self._live.start()
            self._started = True

    def epoch_end(self, line: str) -> None:
        """Prints an epoch's summary above the live display."""
        from rich.text import Text

        self._live.console.print(Text(line))

    def close(self) -> None:
        """Stops redrawing and leaves the last frame on the terminal."""
        if self._started:
            self._live.stop()
            self._started = False

    def _render(self) -> Any:
        # One Text, the bar drawn by hand: a Table holding a ProgressBar renders slower, and
        # every print above the display (an epoch's line) renders the frame again.
        from rich.text import Text

        frame = self.frame
        if frame is None:
            return Text("")
        text = Text()
        text.append(f"{frame.stage} · epoch {frame.epoch} ", style="bold")
        done = round(_BAR * frame.mile / frame.mpe)
        text.append("━" * done, style="magenta")
        text.append("━" * (_BAR - done), style="grey23")
        text.append(f" {frame.mile}/{frame.mpe}  ")
        text.append("  ".join(f"{key} {value}" for key, value in frame.metrics), style="cyan")
        if frame.timing:
            text.append("\n" + frame.timing, style="dim")
        if frame.curve_key:
            title = f"{frame.stage} {frame.curve_key}"
            text.append("\n" + "\n".join(curve_lines(frame.curve, self.span, self.divisor, title)))
        return text


_BAR = 30  # cells of the progress bar
