"""Issue 11 item 5: anchors get umask permissions; killed writers' temp files are swept;
a full disk reports the disk error and leaves no temporary file. Also `dualtrain.atomic`."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dualtrain import TimeMachine, atomic
from tests.checkpoint.crafts import Net

tcraft = pytest.importorskip("dualtrain_torch.craft")
ROOT = Path(__file__).resolve().parents[2]


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def temp_name(final: str, pid: int, host: str | None = None) -> str:
    return f".{final}.{host or atomic._host()}-{pid}-0123abcd{atomic.TEMP_SUFFIX}"


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_anchors_get_the_permissions_of_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        anchor = TimeMachine(save_path=tmp_path).drop(tcraft.realize(Net()))
    finally:
        os.umask(old)
    assert anchor.stat().st_mode & 0o777 == 0o666 & ~mask


def test_the_next_drop_sweeps_temp_files_of_dead_writers_only(tmp_path):
    dead = dead_pid()
    stale = tmp_path / temp_name("Net-1.safetensors", dead)
    live = tmp_path / temp_name("Net-2.safetensors", os.getppid())  # a running process
    foreign = tmp_path / temp_name("Net-3.safetensors", dead, host="ffffffff")  # other host
    other = tmp_path / ".notes.tmp"  # not ours
    for path in (stale, live, foreign, other):
        path.write_bytes(b"half an anchor")
    TimeMachine(save_path=tmp_path).drop(tcraft.realize(Net()))
    assert not stale.exists()
    assert live.exists() and foreign.exists() and other.exists()


def test_atomic_target_renames_on_success_and_removes_on_failure(tmp_path):
    final = tmp_path / "sub" / "f.bin"
    with atomic.atomic_target(final) as tmp:
        assert atomic.is_temp(tmp) and atomic.writer_of(tmp)[:2] == ("f.bin", os.getpid())
        tmp.write_bytes(b"one")
    assert final.read_bytes() == b"one"
    with pytest.raises(KeyError, match="mine"), atomic.atomic_target(final) as tmp:
        tmp.write_bytes(b"two")
        raise KeyError("mine")  # the block's own error comes out unchanged
    assert final.read_bytes() == b"one" and sorted(os.listdir(final.parent)) == ["f.bin"]


def test_sweep_stale_filters_by_final_name(tmp_path):
    dead = dead_pid()
    a = tmp_path / temp_name("a.safetensors", dead)
    b = tmp_path / temp_name("b.h5", dead)
    a.touch()
    b.touch()
    assert atomic.sweep_stale(tmp_path, "*.h5") == [b]
    assert atomic.sweep_stale(tmp_path) == [a]
    assert atomic.sweep_stale(tmp_path / "missing") == []


@pytest.mark.skipif(not hasattr(os, "waitid"), reason="needs os.waitid (Linux)")
def test_a_temp_file_of_a_zombie_writer_is_swept(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped
        stale = tmp_path / temp_name("x.safetensors", child.pid)
        stale.touch()
        assert atomic.sweep_stale(tmp_path) == [stale]
    finally:
        child.wait()


SCRIPT = textwrap.dedent(
    """
    import errno, resource, signal, sys
    from pathlib import Path
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # report EFBIG instead of dying
    from dualtrain import TimeMachine
    from dualtrain_torch.craft import realize
    from tests.checkpoint.crafts import Net
    module = realize(Net(hidden=4096))
    folder = Path(sys.argv[1])
    TimeMachine(save_path=folder).drop(module, "a")
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
    try:
        TimeMachine(save_path=folder).drop(module, "a")
    except OSError as err:
        print("errno", err.errno, type(err).__name__, err.filename)
    """
)


def test_a_file_size_limit_reports_the_disk_error_and_leaves_no_temp_file(tmp_path):
    """EFBIG through RLIMIT_FSIZE: a full disk without root (same path as ENOSPC)."""
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:3] == ["errno", str(errno.EFBIG), "OSError"], out.stdout
    assert out.stdout.split()[3].endswith("a.safetensors")
    assert os.listdir(tmp_path) == ["a.safetensors"]  # the earlier anchor, whole
    module = tcraft.realize(Net(hidden=4096), seed=3)
    TimeMachine().to(module, tmp_path / "a", frozen=True)


@pytest.fixture
def tiny_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the RLIMIT_FSIZE test covers it")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root); the RLIMIT_FSIZE test covers it")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_reports_enospc_and_leaves_no_temp_file(tiny_disk):
    small, big = tcraft.realize(Net(hidden=4)), tcraft.realize(Net(hidden=40_000))
    tm = TimeMachine(save_path=tiny_disk)
    tm.drop(small, "a")
    with pytest.raises(OSError) as caught:
        tm.drop(big, "a")
    assert caught.value.errno == errno.ENOSPC and caught.value.filename.endswith("a.safetensors")
    assert os.listdir(tiny_disk) == ["a.safetensors"]
    TimeMachine().to(tcraft.realize(Net(hidden=4)), tiny_disk / "a", frozen=True)
    with pytest.raises(OSError) as caught:
        tm.drop(big)  # a numbered anchor: retention must not run either
    assert caught.value.errno == errno.ENOSPC and os.listdir(tiny_disk) == ["a.safetensors"]


# ---- adversarial review: long names, numbered anchors never replace a file --------------


def test_a_final_name_near_the_limit_gets_a_shorter_temporary_name(tmp_path):
    name = "a" * 228  # + ".safetensors": 240 bytes, a legal name
    path = TimeMachine(save_path=tmp_path).drop(tcraft.realize(Net()), name)
    assert path.name == name + ".safetensors"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    tmp = atomic.temp_path(tmp_path / ("\u00fc" * 120 + ".safetensors"))  # 252 bytes
    assert len(tmp.name.encode()) <= 255 and atomic.is_temp(tmp)
    final, pid, _ = atomic.writer_of(tmp)
    assert pid == os.getpid() and final.endswith(".safetensors")
    stale = tmp.with_name(tmp.name.replace(f"-{os.getpid()}-", f"-{dead_pid()}-"))
    tmp.rename(stale)
    assert atomic.sweep_stale(tmp_path, "*.safetensors") == [stale]


def test_a_numbered_anchor_never_replaces_a_file(tmp_path):
    final = tmp_path / "f.safetensors"
    final.write_bytes(b"theirs")
    with pytest.raises(FileExistsError), atomic.atomic_target(final, replace=False) as tmp:
        tmp.write_bytes(b"mine")
    assert final.read_bytes() == b"theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["f.safetensors"]

    class Racing(TimeMachine):
        """Another process takes the number this one chose, between choice and rename."""

        raced = False

        def _target(self, craft, file):
            path, stem = super()._target(craft, file)
            if not self.raced:
                self.raced = True
                path.write_bytes(b"the other process's anchor")
            return path, stem

    module = tcraft.realize(Net())
    path = Racing(save_path=tmp_path).drop(module)
    assert path.name == "Net-2.safetensors"
    assert (tmp_path / "Net-1.safetensors").read_bytes() == b"the other process's anchor"
    assert not [p for p in tmp_path.iterdir() if atomic.is_temp(p)]
