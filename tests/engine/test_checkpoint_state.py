"""The run's checkpoint state never names a checkpoint whose files are missing (engine.contract.checkpoint_state)."""

from __future__ import annotations

from pathlib import Path

from engine.contract import checkpoint_state


def _checkpoint(folder: Path, step: int, index: bool = True) -> None:
    (folder / f"ckpt-{step}.data-00000-of-00001").write_bytes(b"x")
    if index:
        (folder / f"ckpt-{step}.index").write_bytes(b"x")


def _state(folder: Path, name: str) -> None:
    (folder / "checkpoint").write_text(f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n'
                                       "all_model_checkpoint_timestamps: 1796452308.5\n")


def test_a_state_naming_a_checkpoint_without_its_index_names_the_complete_ones(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 40)
    _checkpoint(tmp_path, 50)
    _checkpoint(tmp_path, 61, index=False)  # a save lost half-way
    _state(tmp_path, "ckpt-61")
    assert checkpoint_state.repair(tmp_path)
    text = (tmp_path / "checkpoint").read_text()
    assert text.splitlines()[0] == 'model_checkpoint_path: "ckpt-50"'
    assert "ckpt-61" not in text and 'all_model_checkpoint_paths: "ckpt-40"' in text
    assert checkpoint_state.latest(tmp_path) == str(tmp_path / "ckpt-50")
    assert not checkpoint_state.repair(tmp_path)  # once mended, left alone


def test_a_state_naming_nothing_complete_is_removed(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 61, index=False)
    _state(tmp_path, "ckpt-61")
    assert checkpoint_state.repair(tmp_path)
    assert not (tmp_path / "checkpoint").exists()
    assert checkpoint_state.latest(tmp_path) is None


def test_a_state_naming_a_complete_checkpoint_is_kept_as_written(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 7)
    _checkpoint(tmp_path, 9)
    _state(tmp_path, str(tmp_path / "ckpt-7"))  # absolute, and not the newest: TensorFlow's choice stands
    before = (tmp_path / "checkpoint").read_text()
    assert not checkpoint_state.repair(tmp_path)
    assert (tmp_path / "checkpoint").read_text() == before
    assert not checkpoint_state.repair(tmp_path / "no-such-folder")
    assert [step for step, _ in checkpoint_state.complete(tmp_path)] == [7, 9]
