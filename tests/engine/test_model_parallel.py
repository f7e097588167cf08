"""Real model-parallel runs: DTensor meshes over logical CPU devices, one or two client processes."""

from __future__ import annotations

import math
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from engine.contract import config as config_mod
from engine.contract.config import Cluster, ConfigError, Host, RunConfig, Task, replace
from engine.control.launcher import Run
from engine.runtime.model_parallel import leave_together
from tests.conftest import PRESETS, alive

pytestmark = pytest.mark.cluster

STEPS = 20
LEAVE_DELAY = 2.0
U = "unsharded"
#: What the 2 x 2 preset's MLP must look like: hidden units split on 'model', nothing else sharded.
MLP_LAYOUTS = {
    "dense_0/kernel": ([784, 256], [U, "model"], [784, 128]),
    "dense_0/bias": ([256], ["model"], [128]),
    "logits/kernel": ([256, 10], ["model", U], [128, 10]),
    "logits/bias": ([10], [U], [10]),
}

# Runs shared by several tests of this module (each is started by whichever test needs it first).
_runs: dict[str, tuple[Run, list[dict[str, Any]]]] = {}


def comparable(cfg: RunConfig) -> RunConfig:
    """Every step reported; a learning rate at which 20 steps of Adam visibly lower the loss."""
    return replace(cfg, training=replace(cfg.training, steps=STEPS, epochs=None, metrics_hz=1e6,
                                         global_batch_size=64, optimizer="adam", learning_rate=0.002))


def unsharded(cfg: RunConfig) -> RunConfig:
    host = Host(name="local", gpus=0, tasks=(Task("worker", 0),))
    return replace(cfg, name="model-1x1", cluster=Cluster(hosts=(host,)),
                   parallelism=replace(cfg.parallelism, mesh_batch=1, mesh_model=1))


def launch(key: str, cfg: RunConfig, runs_root: Path, timeout: float = 120) -> tuple[Run, list[dict[str, Any]]]:
    if key not in _runs:
        run = Run(cfg, runs_root=runs_root)
        seen: list[dict[str, Any]] = []
        run.add_listener(seen.append)
        run.start()
        assert run.wait(timeout) == "finished", run.state.summary()
        assert not alive(run.pids())
        _runs[key] = (run, seen)
    return _runs[key]


def global_losses(seen: list[dict[str, Any]]) -> list[float]:
    """Per step, the mean of the replicas' losses: each holds an equal slice of the global batch."""
    per_step: dict[int, list[float]] = {}
    for e in seen:
        if e["kind"] == "step":
            per_step.setdefault(e["step"], []).append(e["loss"])
    return [sum(v) / len(v) for _, v in sorted(per_step.items())]


def one_device_run(runs_root: Path) -> tuple[Run, list[dict[str, Any]]]:
    return launch("1x1", unsharded(comparable(config_mod.load(PRESETS / "model-2x2.yaml"))), runs_root)


def two_by_two_run(runs_root: Path) -> tuple[Run, list[dict[str, Any]]]:
    return launch("2x2", comparable(config_mod.load(PRESETS / "model-2x2.yaml")), runs_root)


def assert_same_trajectory(reference: list[float], other: list[float], label: str) -> None:
    assert len(reference) == len(other) == STEPS
    assert reference[-1] < reference[0] - 0.05, "the loss must fall, or the comparison proves nothing"
    for step, (a, b) in enumerate(zip(reference, other, strict=True), start=1):
        assert abs(a - b) <= 1e-4, f"step {step}: 1 device {a:.6f} vs {label} {b:.6f}"


def test_sharded_mlp_follows_the_unsharded_trajectory(runs_root: Path) -> None:
    _, one_seen = one_device_run(runs_root)
    _, seen = two_by_two_run(runs_root)
    assert {e["replica"] for e in one_seen if e["kind"] == "step"} == {0}
    steps = [e for e in seen if e["kind"] == "step"]
    for r in (0, 1):
        mine = [e for e in steps if e["replica"] == r]
        assert [e["step"] for e in mine] == list(range(1, STEPS + 1)), f"replica {r} must report every step"
        assert all(e["task"] == "worker:0" and e["examples_per_sec"] > 0 for e in mine)
    # each replica's loss is the mean over its own half of the batch: the two differ
    assert steps[-1]["loss"] != steps[-2]["loss"]
    assert_same_trajectory(global_losses(one_seen), global_losses(seen), "mesh 2 x 2")


def test_placement_shows_each_variable_laid_out_as_asked(runs_root: Path) -> None:
    _, seen = two_by_two_run(runs_root)
    (placement,) = [e for e in seen if e["kind"] == "placement"]
    assert placement["mesh"] == {"batch": 2, "model": 2} and placement["devices"] == 4
    got = {v["name"]: (v["shape"], v["sharding"], v["shard_shape"]) for v in placement["variables"]}
    assert got == MLP_LAYOUTS
    sharded = [v for v in placement["variables"] if v["name"] != "logits/bias"]
    assert all(not v["replicated"] and v["shards"] == 2 and v["copies"] == 2 for v in sharded)
    lines = next(e["lines"] for e in seen if e["kind"] == "info" and "lines" in e)
    assert "dense_0/kernel [784, 256] sharded (unsharded, model) → shard [784, 128] on 2 devices (×2 copies)" in lines
    mesh_info = next(e for e in seen if e["kind"] == "info" and e.get("strategy") == "DTensor")
    assert mesh_info["replica_ids"] == [0, 1] and len(mesh_info["devices"]) == 4
    # memory per device, from TensorFlow's allocator
    devices = {e["device"] for e in seen if e["kind"] == "device" and e.get("tf_bytes") is not None}
    assert devices == {"CPU:0", "CPU:1", "CPU:2", "CPU:3"}


def test_transformer_shards_vocabulary_heads_and_mlp(runs_root: Path) -> None:
    cfg = config_mod.load(PRESETS / "model-2x2.yaml")
    cfg = replace(cfg, name="model-transformer", data=replace(cfg.data, shape=(16,)),
                  model=replace(cfg.model, name="transformer", hidden=(64,), vocab_size=200, embed_dim=32, heads=4),
                  training=replace(cfg.training, steps=5, global_batch_size=32))
    _, seen = launch("transformer", cfg, runs_root)
    (placement,) = [e for e in seen if e["kind"] == "placement"]
    got = {v["name"]: (v["sharding"], v["shard_shape"]) for v in placement["variables"]}
    assert got["embedding/embeddings"] == (["model", U], [100, 32])  # vocabulary split
    for name in ("query", "key", "value"):
        assert got[f"attention/{name}/kernel"] == ([U, "model", U], [32, 2, 8])  # 2 of the 4 heads each
    assert got["attention/output/kernel"] == (["model", U, U], [2, 8, 32])
    assert got["mlp_0/kernel"] == ([U, "model"], [32, 32])
    assert got["mlp_out/kernel"] == (["model", U], [32, 32])
    assert got["logits/kernel"] == ([U, U], [32, 10])
    losses = [e["loss"] for e in seen if e["kind"] == "step"]
    assert losses and all(math.isfinite(x) for x in losses)


def test_two_clients_complete_with_both_reporting(runs_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = comparable(config_mod.load(PRESETS / "model-2clients.yaml"))
    monkeypatch.setenv("CLUSTERDECK_TEST_LEAVE_DELAY", str(LEAVE_DELAY))  # worker:1 says goodbye late
    run, seen = launch("2clients", cfg, runs_root)
    assert {t.state for t in run.state.tasks.values()} == {"finished"} and len(run.state.tasks) == 2
    steps = [e for e in seen if e["kind"] == "step"]
    assert {e["replica"] for e in steps if e["task"] == "worker:0"} == {0}
    assert {e["replica"] for e in steps if e["task"] == "worker:1"} == {1}
    clients = {e["task"]: e for e in seen if e["kind"] == "info" and e.get("strategy") == "DTensor"}
    assert {t: (e["client"], e["clients"]) for t, e in clients.items()} == {"worker:0": (0, 2), "worker:1": (1, 2)}
    # client 0 hosts the coordination service: it left only after worker:1's late goodbye
    last_step_1 = max(e["t"] for e in steps if e["task"] == "worker:1")
    finished_0 = next(e["t"] for e in seen if e["kind"] == "status" and e["task"] == "worker:0"
                      and e.get("state") == "finished")
    assert finished_0 - last_step_1 >= LEAVE_DELAY
    # one mesh across both processes: the same training as on one device
    _, one_seen = one_device_run(runs_root)
    assert_same_trajectory(global_losses(one_seen), global_losses(seen), "2 clients")


def _rejected(cfg: RunConfig, runs_root: Path) -> str:
    run = Run(cfg, runs_root=runs_root)
    with pytest.raises(ConfigError) as err:
        run.start()
    assert not run.started and not runs_root.exists(), "nothing may be launched or written"
    return str(err.value)


def test_impossible_mesh_is_rejected_before_launch(runs_root: Path) -> None:
    cfg = config_mod.load(PRESETS / "model-2x2.yaml")
    text = _rejected(replace(cfg, parallelism=replace(cfg.parallelism, mesh_batch=3, mesh_model=2)), runs_root)
    assert "parallelism.mesh: batch x model = 3 x 2 = 6 does not match the 4 devices" in text
    text = _rejected(replace(cfg, model=replace(cfg.model, hidden=(255,))), runs_root)
    assert "model.hidden[0]: 255 is not divisible by the mesh 'model' axis size 2" in text
    wide = replace(cfg, parallelism=replace(cfg.parallelism, mesh_batch=1, mesh_model=4))
    text = _rejected(replace(wide, model=replace(cfg.model, name="transformer", heads=6, embed_dim=48),
                             data=replace(cfg.data, shape=(16,))), runs_root)
    assert "model.heads: 6 is not divisible by the mesh 'model' axis size 4" in text


class _Store:
    """A stand-in for the coordination service's key-value store, recording the calls."""

    def __init__(self, missing: Collection[str] = (), gone: bool = False) -> None:
        self.calls: list[tuple[str, str]] = []
        self.missing, self.gone = missing, gone

    def set_config_key_value(self, key: str, value: str) -> None:
        self.calls.append(("set", key))
        if self.gone:
            raise RuntimeError("Connection reset by peer")

    def get_config_key_value(self, key: str, timeout_in_ms: int = 0) -> str:
        self.calls.append(("get", key))
        if key in self.missing:
            raise RuntimeError("DEADLINE_EXCEEDED")
        return "1"


def test_client_0_leaves_after_every_other_clients_goodbye() -> None:
    leader = _Store(missing={"clusterdeck-left/2"})
    leave_together(0, 4, leader)  # a client that died after the barrier does not keep it waiting
    assert leader.calls == [("get", "clusterdeck-left/1"), ("get", "clusterdeck-left/2"),
                            ("get", "clusterdeck-left/3")]
    other = _Store(gone=True)
    leave_together(2, 4, other)  # client 0 already gone when the goodbye is answered: not a failure
    assert other.calls == [("set", "clusterdeck-left/2")]


@pytest.mark.cluster
def test_model_mode_validates_every_n_steps_with_the_loss_and_accuracy(runs_root: Path) -> None:
    from engine.contract.config import Validation
    from tests import kit

    cfg = config_mod.load(PRESETS / "model-2x2.yaml")
    cfg = replace(cfg, training=replace(cfg.training, steps=30, checkpoint_every=0),
                  validation=Validation(split=0.2, every=10))
    evals = [e for e in kit.run_to_end(cfg, runs_root) if e["kind"] == "eval"]
    assert [e["step"] for e in evals] == [10, 20, 30]
    assert all(math.isfinite(e["loss"]) and 0.0 <= e["metrics"]["accuracy"] <= 1.0 and e["examples"] > 0
               for e in evals), evals
