"""TensorBoard summaries: at most one point per replica and interval, the last one always written."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402

from engine.runtime.summaries import Summaries  # noqa: E402


def read(logdir: Path, tag: str) -> dict[int, float]:
    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    return {int(ev.step): float(tensor_util.make_ndarray(ev.tensor_proto)) for ev in acc.Tensors(tag)}


def test_points_are_thinned_per_replica_and_the_last_one_is_kept(tmp_path: Path) -> None:
    summaries = Summaries(tmp_path, interval_s=3600.0)  # nothing but the first point is due within the test
    for step in range(1, 21):
        summaries.replica(0, step, loss=float(step), step_time=None)
        if step % 5 == 0:
            summaries.replica(1, step, loss=100.0 + step)
    summaries.close()
    # replica 0: its first point, then only its newest held one (written at close); replica 1 likewise
    assert read(tmp_path / "replica_0", "loss") == {1: 1.0, 20: 20.0}
    assert read(tmp_path / "replica_1", "loss") == {5: 105.0, 20: 120.0}
    assert "step_time" not in EventAccumulator(str(tmp_path / "replica_0")).Reload().Tags()["tensors"]


def test_every_point_is_written_when_they_come_slower_than_the_interval(tmp_path: Path) -> None:
    summaries = Summaries(tmp_path, interval_s=0.0)
    for step in range(1, 6):
        summaries.replica(3, step, loss=step / 10)
    summaries.close()
    assert read(tmp_path / "replica_3", "loss") == pytest.approx({s: s / 10 for s in range(1, 6)})


def test_replicas_and_validation_share_plain_tags_with_hparams(tmp_path: Path) -> None:
    """TensorBoard's convention: a run per replica (and one for validation), one chart per tag."""
    summaries = Summaries(tmp_path, interval_s=0.0, hparams={"optimizer": "sgd", "learning_rate": 0.1}, trial="t")
    summaries.replica(0, 1, loss=2.0, accuracy=0.5)
    summaries.replica(1, 1, loss=2.5, accuracy=0.25)
    summaries.validation(1, loss=2.2, accuracy=0.4)
    summaries.close()
    assert read(tmp_path / "replica_1", "accuracy") == {1: 0.25}
    assert read(tmp_path / "validation", "loss") == pytest.approx({1: 2.2})
    tags = EventAccumulator(str(tmp_path / "replica_0")).Reload().Tags()["tensors"]
    assert "_hparams_/session_start_info" in tags
