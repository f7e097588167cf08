"""The faults tests inject into tasks are read in one place, and bad values inject nothing."""

from __future__ import annotations

import pytest

from engine.runtime import fault_hooks


def test_each_hook_reads_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not fault_hooks.should_fail("worker:1") and fault_hooks.start_delay() == 0.0
    monkeypatch.setenv(fault_hooks.FAIL, "worker:1")
    monkeypatch.setenv(fault_hooks.START_DELAY, "2.5")
    monkeypatch.setenv(fault_hooks.STEP_DELAY, "worker:1=0.03")
    monkeypatch.setenv(fault_hooks.LEAVE_DELAY, "1")
    assert fault_hooks.should_fail("worker:1") and not fault_hooks.should_fail("worker:0")
    assert not fault_hooks.should_fail("")
    assert fault_hooks.start_delay() == 2.5 and fault_hooks.leave_delay() == 1.0
    assert fault_hooks.step_delay("worker:1") == 0.03 and fault_hooks.step_delay("worker:0") == 0.0


@pytest.mark.parametrize("text", ["", "soon", "-3", "nan-ish"])
def test_a_bad_value_injects_nothing(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(fault_hooks.START_DELAY, text)
    monkeypatch.setenv(fault_hooks.STEP_DELAY, f"worker:0={text}")
    assert fault_hooks.start_delay() == 0.0 and fault_hooks.step_delay("worker:0") == 0.0


def test_no_other_module_reads_a_test_variable() -> None:
    from pathlib import Path

    root = Path(fault_hooks.__file__).parents[2]
    readers = [p.relative_to(root).as_posix() for folder in ("engine", "gui", "clusterdeck")
               for p in (root / folder).rglob("*.py")
               if "CLUSTERDECK_TEST_" in p.read_text(encoding="utf-8") and p.name != "fault_hooks.py"]
    assert readers in ([], ["engine/runtime/model_parallel.py"]), readers
