"""Where a process stands in a run (from torchrun's or SLURM's environment) and the Tank's
share of it (`Tank.shard`, what `Multiverse.sync` does to each Tank)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dualtrain import ArgumentError
from dualtrain.fuel import FuelGenerator, Tank
from dualtrain.multiverse import World, from_environment
from dualtrain.multiverse.world import SPAWNED
from tests.fuel.raw import DTYPES, make_folder

N = 45


@given(
    processes=st.integers(1, 64), data=st.data(), port=st.integers(1, 65000),
    addr=st.sampled_from(["10.0.0.7", "node-3"]), jax=st.booleans(),
)  # fmt: skip
def test_torchrun_variables_give_the_world(processes, data, port, addr, jax) -> None:
    rank = data.draw(st.integers(0, processes - 1))
    env = {"RANK": str(rank), "WORLD_SIZE": str(processes), "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": addr, "MASTER_PORT": str(port)}  # fmt: skip
    if jax:
        env["JAX_COORDINATOR_ADDRESS"] = "10.0.0.9:1234"
    world = from_environment(env)
    assert world == World(
        processes=processes, rank=rank, local_rank=0, local_processes=1, master_addr=addr,
        master_port=port, source="torchrun",
        coordinator="10.0.0.9:1234" if jax else f"{addr}:{port + 1}",
    )  # fmt: skip
    assert world.is_main == (rank == 0)


def test_slurm_and_spawned_and_none() -> None:
    task = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
            "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}  # fmt: skip
    world = from_environment({**task, "MASTER_ADDR": "n1"})
    assert world is not None
    assert (world.rank, world.processes, world.local_rank, world.local_processes) == (3, 4, 1, 2)
    assert (world.source, world.master_port, world.coordinator) == ("slurm", 29500, "n1:29501")
    # Over two hosts without MASTER_ADDR: no address to guess; JAX finds SLURM's itself.
    alone = from_environment(task)
    assert alone is not None and (alone.master_addr, alone.coordinator) == ("", None)
    uneven = from_environment({**task, "SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_NODEID": "0",
                               "SLURM_PROCID": "2", "SLURM_LOCALID": "2"})  # fmt: skip
    assert uneven is not None and uneven.local_processes == 3
    one_host = from_environment({**task, "SLURM_STEP_TASKS_PER_NODE": "4", "SLURM_NODEID": "0"})
    assert one_host is not None and one_host.master_addr == "127.0.0.1"
    batch_script = {k: v for k, v in task.items() if k != "SLURM_STEP_ID"}
    assert from_environment(batch_script) is None  # the script itself is no worker
    assert from_environment({**task, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None
    assert from_environment({}) is None
    spawned = from_environment({"RANK": "1", "WORLD_SIZE": "2", SPAWNED: "2"})
    assert spawned is not None and (spawned.source, spawned.local_devices) == ("spawned", 2)


def test_torch_over_hosts_without_master_addr_is_refused_at_init(monkeypatch) -> None:
    from dualtrain import Multiverse

    task = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
            "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}  # fmt: skip
    for name, value in task.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ArgumentError, match="export MASTER_ADDR"):
        Multiverse(lambda mv: None, 1).init()


@pytest.mark.parametrize(
    "env",
    [{"RANK": "2", "WORLD_SIZE": "2"}, {"RANK": "x", "WORLD_SIZE": "2"},
     {"RANK": "-1", "WORLD_SIZE": "2"}, {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "p"}],
)  # fmt: skip
def test_an_inconsistent_environment_is_refused(env) -> None:
    with pytest.raises(ArgumentError, match=r"RANK|rank|MASTER_PORT"):
        from_environment(env)


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("raw")
    make_folder(str(folder), N, size=(4, 4))
    gen = FuelGenerator(file_dir=str(folder), file_list=str(folder / "list.csv"), dtype=DTYPES)
    return gen.generate(str(folder / "p.h5"), 4, 4, encode="PNG", workers=0).paths


def names(tank: Tank, mask: str | None = None) -> list[str]:
    out = []
    for batch in tank:
        keep = batch[mask] if mask else np.ones(len(batch["name"]), bool)
        out += [n for n, k in zip(batch["name"], keep, strict=True) if k]
    return out


@settings(max_examples=15, deadline=None)
@given(world=st.integers(1, 5), batch=st.integers(1, 9), seed=st.integers(0, 9),
       end=st.sampled_from(["fill", "drop", "pad", "short"]))  # fmt: skip
def test_shard_serves_what_a_tank_built_for_the_rank_serves(pack, world, batch, seed, end):
    spec = {"name": "str"}
    kw = {"seed": seed, "drop_last": end == "drop", "pad": end == "pad",
          "in_same_size": end != "short"}  # fmt: skip
    shares = []
    for rank in range(world):
        with (
            Tank(pack, spec, batch, **kw) as resharded,
            Tank(pack, spec, batch, rank=rank, world=world, **kw) as built,
        ):
            resharded.shard(rank, world)
            assert resharded.batches_per_epoch == built.batches_per_epoch
            mine = names(resharded, "mask" if end == "pad" else None)
            assert mine == names(built, "mask" if end == "pad" else None)
            shares.append(mine)
    rows = [n for share in shares for n in share]
    if end == "pad":  # evaluation: every row once over all ranks
        assert sorted(rows) == sorted(f"item {i}" for i in range(N))
    else:  # disjoint shares
        distinct = {n for share in shares for n in set(share)}
        assert sum(len(set(s)) for s in shares) == len(distinct)


def test_shard_is_refused_mid_epoch_and_for_bad_ranks(pack) -> None:
    with Tank(pack, {"name": "str"}, 4) as tank:
        with pytest.raises(ArgumentError, match=r"^rank must be"):
            tank.shard(2, 2)
        with pytest.raises(ArgumentError, match=r"^world must be"):
            tank.shard(0, N + 1)
        tank.next()
        with pytest.raises(ArgumentError, match="start of an epoch"):
            tank.shard(0, 2)
        assert tank.batches_per_epoch == -(-N // 4)  # unchanged by the refusals
