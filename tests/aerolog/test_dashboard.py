"""DashBoard: every gauged value reaches the CSV, PNGs show the curves, an interrupted log
leaves the previous files whole, device scalars are read every `interval` steps only, and
off a terminal it prints plain lines."""

from __future__ import annotations

import csv
import inspect
import io
import math
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from PIL import Image
from rich.console import Console

from dualtrain.aerolog import DashBoard
from dualtrain.errors import ArgumentError


def plain_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=120), out  # a StringIO is no terminal


class FakeClock:
    """Seconds that pass only when the test says so (a step's compute, a batch's wait)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


runs = st.lists(
    st.tuples(
        st.sampled_from(["train", "test"]),
        st.integers(1, 6),  # mpe
        st.integers(1, 3),  # interval
        st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=3),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=25, deadline=None)
@given(epochs=runs)
def test_every_gauged_value_reaches_the_csv_exactly(epochs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("log")
    console, _ = plain_console()
    dash = DashBoard(folder, window=2, console=console)
    gauged = []
    for epoch, (stage, mpe, interval, values) in enumerate(epochs):
        for mile in range(1, mpe + 1):
            entry = {f"m{i}": v * mile for i, v in enumerate(values)}
            dash.gauge(entry, mile, epoch, mpe, stage, interval=interval)
            gauged += [(stage, epoch, mile, key, v) for key, v in entry.items()]
    dash.log(gauge=False)
    got = [(r["stage"], int(r["epoch"]), int(r["mile"]), r["key"], float(r["value"]))
           for r in rows(folder / "metrics.csv")]  # fmt: skip
    assert sorted(got) == sorted(gauged)
    for r in rows(folder / "epochs.csv"):
        values = [
            v for s, e, _, k, v in gauged if (s, e, k) == (r["stage"], int(r["epoch"]), r["key"])
        ]
        assert float(r["mean"]) == pytest.approx(np.mean(values), rel=1e-12, abs=1e-9)
        assert int(r["points"]) == len(values)
        assert dash.read(r["key"], r["stage"], int(r["epoch"])) == float(r["mean"])


def test_pngs_decode_and_show_each_stage_curve(tmp_path):
    console, _ = plain_console()
    dash = DashBoard(tmp_path, window=3, console=console)
    for epoch in range(3):
        for mile in range(1, 21):
            dash.gauge({"loss": math.exp(-(epoch * 20 + mile) / 15), "lr/group 0": 0.1}, mile,
                       epoch, 20, "train")  # fmt: skip
        dash.gauge({"loss": 0.5 / (epoch + 1)}, 1, epoch, 1, "test")
    written = dash.log(tachograph=False)
    assert {p.name for p in written} == {"loss.png", "lr_group_0.png"}
    with Image.open(tmp_path / "loss.png") as im:
        assert im.format == "PNG" and im.size == (640, 400)
        pixels = np.asarray(im.convert("RGB")).reshape(-1, 3).astype(int)
    # matplotlib's first two colours: the train curve (C0) and the test stage (C1).
    for colour in ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)):
        assert (np.abs(pixels - colour).sum(1) < 30).sum() > 40, colour


def test_a_killed_log_leaves_the_previous_files_whole(tmp_path):
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from rich.console import Console\n"
        "from dualtrain.aerolog import DashBoard\n"
        "d = DashBoard(sys.argv[1], console=Console(file=open('/dev/null', 'w')))\n"
        "step = 0\n"
        "while True:\n"
        "    for m in range(1, 201):\n"
        "        step += 1\n"
        "        d.gauge({'loss': 1 / step, 'acc': step % 7}, m, step // 200, 200, 'train')\n"
        "    d.log(record='history.csv')\n"
        "    print('logged', flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        for _ in range(3):
            assert proc.stdout.readline() == "logged\n"
        time.sleep(0.15)  # somewhere inside a later log
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    points = rows(tmp_path / "metrics.csv")
    assert len(points) % 400 == 0 and len(points) >= 1200  # whole logs only
    assert len(rows(tmp_path / "history.csv")) % 400 == 0
    assert [r["value"] for r in points[:4]] == ["1.0", "1.0", "0.5", "2.0"]
    for name in ("loss.png", "acc.png"):
        with Image.open(tmp_path / name) as im:
            im.load()
    # The next write into the folder sweeps what the killed writer left.
    console, _ = plain_console()
    again = DashBoard(tmp_path, console=console)
    again.gauge({"loss": 1.0}, 1, 0, 1, "train")
    again.log()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".dt-tmp")]


def test_record_appends_across_runs(tmp_path):
    for run in range(2):
        console, _ = plain_console()
        dash = DashBoard(tmp_path, console=console)
        for mile in range(1, 4):
            dash.gauge({"loss": run + mile / 10}, mile, run, 3, "train")
        dash.log(gauge=False, tachograph=False, record="history.csv")
        dash.log(gauge=False, tachograph=False, record="history.csv")  # nothing new: no repeat
    text = (tmp_path / "history.csv").read_text()
    assert text.count("stage,epoch") == 1
    assert [float(r["value"]) for r in rows(tmp_path / "history.csv")] == [
        0.1, 0.2, 0.3, 1.1, 1.2, 1.3
    ]  # fmt: skip
    (tmp_path / "other.csv").write_text("not,a,record\n")
    with pytest.raises(ValueError, match="not a dashboard record"):
        dash.log(record="other.csv")


# -- device scalars ------------------------------------------------------------------------


def test_torch_scalars_are_read_every_interval_steps_only():
    torch = pytest.importorskip("torch")

    class Counted(torch.Tensor):
        reads = 0

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func in (torch.Tensor.item, torch.Tensor.__float__, torch.Tensor.tolist):
                cls.reads += 1
            return super().__torch_function__(func, types, args, kwargs or {})

    console, _ = plain_console()
    dash = DashBoard(console=console)
    seen = []
    for mile in range(1, 13):
        loss = (torch.tensor(1.0) / mile).as_subclass(Counted)
        acc = torch.tensor([0.5]).as_subclass(Counted)
        Counted.reads = 0
        dash.gauge({"loss": loss, "acc": acc}, mile, 0, 12, "train", interval=4)
        seen.append(Counted.reads)
    assert seen == [0, 0, 0, 8] * 3  # the 4 steps' 2 values each, read together
    assert dash.read("loss", "train") == pytest.approx(np.mean([1 / m for m in range(1, 13)]))


def test_jax_scalars_stay_unread_on_the_device_until_the_interval():
    jnp = pytest.importorskip("jax.numpy")
    console, _ = plain_console()
    dash = DashBoard(console=console)
    values = [jnp.float32(m) * 2 for m in range(1, 7)]
    for mile, value in enumerate(values[:2], 1):
        dash.gauge({"loss": value}, mile, 0, 6, "train", interval=3)
    assert [v for _, v in dash._pending] == values[:2]  # the arrays themselves, unread
    dash.gauge({"loss": values[2]}, 3, 0, 6, "train", interval=3)
    assert dash._pending == []
    assert [p.value for p in dash.book.points("train", "loss")] == [2.0, 4.0, 6.0]


# -- what is shown -------------------------------------------------------------------------


def test_off_a_terminal_it_prints_plain_lines():
    console, out = plain_console()
    formats = {"acc": (".1f", "percent"), "lr": (lambda v: f"{v:.0e}", "tailor")}
    dash = DashBoard(window=2, format=formats, console=console, clock=FakeClock())
    for mile in range(1, 5):
        dash.gauge({"loss": mile / 10, "acc": 0.5, "lr": 1e-3}, mile, 2, 4, "train", interval=2,
                   duration=0.01, samples=32)  # fmt: skip
    lines = out.getvalue().splitlines()
    assert "\x1b" not in out.getvalue()
    assert lines[0] == ("train epoch 2 2/4 | loss 0.15 | acc 50.0% | lr 1e-03 | "
                        "3200.0 samples/s | step 10.0 ms")  # fmt: skip
    assert lines[1].startswith("train epoch 2 4/4 | loss 0.35 | acc 50.0%")
    # The steps' times are the durations given; the epoch's is the clock's, still at 0.
    assert lines[2] == "train epoch 2 done | loss 0.25 | acc 50.0% | lr 1e-03 | 0.0 s"
    assert len(lines) == 3


def test_a_terminal_gets_the_live_bar_and_curve():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, color_system=None)
    with DashBoard(span=20, divisor=5, console=console) as dash:
        for mile in range(1, 31):
            dash.gauge({"loss": 1 / mile}, mile, 1, 30, "train", duration=0.01)
    text = out.getvalue()
    assert "train · epoch 1" in text and "30/30" in text and "train epoch 1 done" in text
    assert "└" in text and "train loss" in text and text.count("•") >= 20


def test_inviz_values_go_to_their_callable_only():
    calls = []
    console, out = plain_console()
    dash = DashBoard(format={"image": (lambda *a: calls.append(a), "inviz")}, console=console)
    dash.gauge({"image": 7, "loss": 1.0}, 1, 0, 1, "test")
    assert calls == [("test", 0, 1, 1, 7.0)] and "image" not in out.getvalue()


def _fed_epoch(clock: FakeClock, pause: float = 0.0) -> str:
    """Four steps: each batch waits 20 ms for data, each step computes 5 ms (on `clock`;
    `pause` real seconds pass besides, as on a busy machine)."""

    def slow_batches():
        for i in range(4):
            time.sleep(pause)
            clock.now += 0.02
            yield i

    console, out = plain_console()
    dash = DashBoard(console=console, clock=clock)
    for mile, _ in enumerate(dash.feed(slow_batches()), 1):
        time.sleep(pause)
        clock.now += 0.005
        dash.gauge({"loss": 1.0}, mile, 0, 4, "train", interval=4)
    return out.getvalue()


def test_the_data_wait_is_split_from_compute():
    # The first step is untimed (no gauge before it); the three after take 25 ms each.
    text = _fed_epoch(FakeClock())
    assert text.splitlines() == [
        "train epoch 0 4/4 | loss 1 | 40.00 steps/s | step 25.0 ms (data 20.0 ms, compute 5.0 ms)",
        "train epoch 0 done | loss 1 | 0.1 s",
    ]


def test_time_spent_deciding_is_shown_apart_from_step_time():
    """A ladder deciding mid-epoch (a compile between two steps) is not step time: the steps
    show what they cost, the deciding its own seconds, per read and in the epoch's line."""
    from dualtrain.accelerate import LadderOptions
    from dualtrain.accelerate.dispatch import Decider
    from tests.accelerate.test_accelerate_dispatch import BACKENDS, PARTS, World
    from tests.accelerate.test_accelerate_ladder import CLOCK

    console, out = plain_console()
    dash = DashBoard(console=console, clock=CLOCK)
    options = LadderOptions(warm_steps=2, cache=False, clock=CLOCK, budget=math.inf)
    decider, world = Decider("torch", BACKENDS, options), World({"CHANNELS_LAST": {"build_s": 3.0}})
    for mile in range(1, 5):
        if mile == 3:  # the ladder climbs at this step's first call: 3 s of build, trials
            decider.decide("train", "s", PARTS, world.trials("train", "s"))
        CLOCK.advance(0.005)
        dash.gauge({"loss": 1.0}, mile, 0, 4, "train", interval=4)
    spent = decider.decisions[("train", "s")].decide_s
    assert spent > 3.0
    assert out.getvalue().splitlines() == [
        f"train epoch 0 4/4 | loss 1 | 200.00 steps/s | step 5.0 ms | deciding {spent:.1f} s",
        f"train epoch 0 done | loss 1 | {0.015 + spent:.1f} s (deciding {spent:.1f} s)",
    ]


@pytest.mark.parametrize("start", [0.0, 1e4])
def test_what_is_shown_holds_whatever_else_runs_on_the_machine(start):
    """Real time passing between the clock's readings changes nothing: only the clock given
    is read (one that starts at 0 too), so the lines are the same to the last digit."""
    assert _fed_epoch(FakeClock(start), pause=0.01) == _fed_epoch(FakeClock(start))


def test_the_clock_is_checked_and_the_performance_counter_by_default():
    console, _ = plain_console()
    with pytest.raises(ArgumentError, match=r"clock must be a callable returning seconds, "
                       r"like time.perf_counter; got clock=0.0"):  # fmt: skip
        DashBoard(console=console, clock=0.0)
    default = inspect.signature(DashBoard).parameters["clock"].default
    assert default is time.perf_counter


def test_ranks_other_than_zero_draw_and_write_nothing(tmp_path):
    console, out = plain_console()
    dash = DashBoard(tmp_path / "logs", rank=1, console=console)
    dash.gauge({"loss": 1.0}, 1, 0, 1, "train")
    assert dash.log(record="h.csv") == [] and out.getvalue() == ""
    assert not (tmp_path / "logs").exists()
    assert dash.read("loss", "train") == 1.0  # its own values stay readable


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"entry": [1.0]}, "entry"),
        ({"entry": {"loss": "1"}}, r"entry\['loss'\]"),
        ({"entry": {"loss": True}}, r"entry\['loss'\]"),
        ({"entry": {"loss": np.ones(3)}}, r"entry\['loss'\]"),
        ({"mile": 0}, "mile"),
        ({"mile": 5}, "mile"),
        ({"epoch": 1.5}, "epoch"),
        ({"mpe": 0}, "mpe"),
        ({"stage": ""}, "stage"),
        ({"interval": 0}, "interval"),
        ({"duration": -1.0}, "duration"),
        ({"samples": -3}, "samples"),
    ],
)
def test_bad_gauge_arguments_are_named(kwargs, name):
    console, _ = plain_console()
    dash = DashBoard(console=console)
    args = {"entry": {"loss": 1.0}, "mile": 1, "epoch": 0, "mpe": 4, "stage": "train", **kwargs}
    with pytest.raises(ArgumentError, match=name):
        dash.gauge(**args)
    assert dash._pending == [] and dash.book.slots() == []  # nothing half-noted


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"window": 0}, "window"),
        ({"divisor": 1}, "divisor"),
        ({"span": True}, "span"),
        ({"format": {"loss": ".4f"}}, "format"),
        ({"format": {"loss": (".4f", "bold")}}, "mode"),
        ({"format": {"loss": ("%q", "raw")}}, "fmt"),
        ({"format": {"loss": (".4f", "tailor")}}, "fmt"),
        ({"log_path": 3}, "log_path"),
        ({"rank": -1}, "rank"),
    ],
)
def test_bad_dashboard_arguments_are_named(kwargs, name):
    with pytest.raises(ArgumentError, match=name):
        DashBoard(**kwargs)


@given(
    epochs=st.lists(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=9),
                    min_size=1, max_size=4),
    window=st.integers(1, 5),
    last=st.integers(0, 12),
)  # fmt: skip
def test_moving_means_start_again_each_epoch(epochs, window, last):
    from dualtrain.aerolog.book import MetricBook, Point

    book = MetricBook(window)
    expected = []
    for epoch, values in enumerate(epochs):
        for mile, v in enumerate(values, 1):
            book.add(Point("train", "loss", epoch, mile, len(values), v))
            recent = values[max(0, mile - window) : mile]
            expected.append(sum(recent) / len(recent))
            assert book.moving("train", "loss") == pytest.approx(expected[-1])
    assert book.moving_series("train", "loss") == pytest.approx(expected)
    assert book.moving_series("train", "loss", last) == pytest.approx(
        expected[-last:] if last else []
    )


# -- from the review: values the caller reuses, graphs, tracers, ranks, names ---------------


def test_buffers_updated_in_place_are_gauged_as_they_were():
    torch = pytest.importorskip("torch")
    console, _ = plain_console()
    dash = DashBoard(console=console)
    total, host = torch.zeros(()), np.zeros(1)
    for mile in range(1, 5):
        total += mile
        host[0] = mile
        dash.gauge({"total": total, "host": host}, mile, 0, 4, "train", interval=4)
    assert [p.value for p in dash.book.points("train", "total")] == [1, 3, 6, 10]
    assert [p.value for p in dash.book.points("train", "host")] == [1, 2, 3, 4]


def test_a_loss_with_its_graph_is_kept_without_it():
    torch = pytest.importorskip("torch")
    from dualtrain.aerolog.values import kept

    w = torch.ones(3, requires_grad=True)
    loss = (w * 2).sum()
    held = kept("entry['loss']", loss)
    assert held.grad_fn is None and not held.requires_grad and float(held) == 6.0


@pytest.mark.parametrize("bad", ["abc", "complex", "bool", "many"])
def test_values_that_cannot_be_read_are_refused_at_gauge(bad):
    value = {"abc": np.array("abc"), "complex": np.array(1 + 2j), "bool": np.array(True),
             "many": np.ones(2)}[bad]  # fmt: skip
    console, _ = plain_console()
    dash = DashBoard(console=console)
    dash.gauge({"loss": 1.0}, 1, 0, 4, "train", interval=4)
    with pytest.raises(ArgumentError, match=r"entry\['x'\]"):
        dash.gauge({"loss": 2.0, "x": value}, 2, 0, 4, "train", interval=4)
    dash.gauge({"loss": 3.0}, 4, 0, 4, "train")
    assert [p.value for p in dash.book.points("train", "loss")] == [1.0, 3.0]  # none lost


def test_a_jax_tracer_is_refused_naming_why():
    jax = pytest.importorskip("jax")
    console, _ = plain_console()
    dash = DashBoard(console=console)

    @jax.jit
    def step(x):
        dash.gauge({"loss": x * 2}, 1, 0, 1, "train")
        return x

    with pytest.raises(ArgumentError, match=r"outside jax\.jit"):
        step(1.0)


def test_the_rank_is_the_launchers(monkeypatch, tmp_path):
    slurm = {"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "2",
             "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "2"}  # fmt: skip
    for name, value in slurm.items():
        monkeypatch.setenv(name, value)
    assert DashBoard(tmp_path).rank == 1
    monkeypatch.setenv("SLURM_PROCID", "abc")
    with pytest.raises(ArgumentError, match="SLURM_PROCID"):
        DashBoard(tmp_path)


def test_metrics_whose_file_names_meet_get_their_own_png(tmp_path):
    console, _ = plain_console()
    dash = DashBoard(tmp_path, console=console)
    dash.gauge({"a/b": 1.0, "a_b": 2.0}, 1, 0, 1, "train")
    names = [p.name for p in dash.log(tachograph=False)]
    assert len(set(names)) == 2 and all(n.startswith("a_b") and n.endswith(".png") for n in names)


def test_values_too_large_to_draw_still_reach_the_csv_and_record(tmp_path):
    console, _ = plain_console()
    dash = DashBoard(tmp_path, console=console)
    for mile in range(1, 4):
        dash.gauge({"huge": 1e308, "loss": 1.0}, mile, 0, 3, "train")
    with pytest.warns(RuntimeWarning, match="huge: no curve drawn"):
        written = {p.name for p in dash.log(record="history.csv")}
    assert {"metrics.csv", "epochs.csv", "history.csv", "loss.png"} <= written
    assert "huge.png" not in written
