"""`MetricBook`: every gauged value by stage and metric, with moving and epoch means.

Values arrive as host floats (the dashboard reads device scalars before they get here).
An epoch's mean is over the steps that were reported, not divided by the epoch's length: a
loop that breaks early or gauges every few steps still gets the right mean.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["MetricBook", "Point"]


@dataclass(frozen=True)
class Point:
    """One gauged value: where in training it was (epoch, mile of mpe) and what it was."""

    stage: str
    key: str
    epoch: int
    mile: int
    mpe: int
    value: float

    @property
    def position(self) -> float:
        """Epochs into training: ``epoch + mile / mpe`` (stages with other mpe line up)."""
        return self.epoch + self.mile / self.mpe


class MetricBook:
    """Points per (stage, key) in arrival order, and a moving window of `window` values."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._points: dict[tuple[str, str], list[Point]] = {}
        self._recent: dict[tuple[str, str], deque[float]] = {}
        self._arrived: list[Point] = []
        self.logged = 0  # points already appended to a record file

    def add(self, point: Point) -> None:
        """Files `point` under its stage and key."""
        slot = (point.stage, point.key)
        self._points.setdefault(slot, []).append(point)
        self._recent.setdefault(slot, deque(maxlen=self.window)).append(point.value)
        self._arrived.append(point)

    def slots(self) -> list[tuple[str, str]]:
        """(stage, key) pairs in the order they first appeared."""
        return list(self._points)

    def points(self, stage: str, key: str) -> list[Point]:
        """The points of one metric in one stage, oldest first."""
        return list(self._points.get((stage, key), ()))

    def all_points(self) -> list[Point]:
        """Every point, in the order they arrived."""
        return list(self._arrived)

    def moving(self, stage: str, key: str) -> float | None:
        """The mean of the last `window` values (None before any)."""
        recent = self._recent.get((stage, key))
        return sum(recent) / len(recent) if recent else None

    def moving_series(self, stage: str, key: str) -> list[float]:
        """The moving mean at each point, oldest first."""
        values = [p.value for p in self._points.get((stage, key), ())]
        out, window, total = [], deque[float](), 0.0
        for v in values:
            window.append(v)
            total += v
            if len(window) > self.window:
                total -= window.popleft()
            out.append(total / len(window))
        return out

    def epoch_means(self, stage: str, key: str) -> dict[int, float]:
        """Epoch -> the mean of the values reported in it."""
        sums: dict[int, list[float]] = {}
        for p in self._points.get((stage, key), ()):
            sums.setdefault(p.epoch, []).append(p.value)
        return {epoch: sum(vs) / len(vs) for epoch, vs in sums.items()}
