"""The ``clusterdeck`` command as a user runs it: a subprocess started from an unrelated folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import psutil
import pytest

from engine.contract import config as config_mod
from engine.contract import presets
from tests.conftest import ROOT, command_line


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), CLUSTERDECK_RUNS=str(tmp_path / "runs"), QT_QPA_PLATFORM="offscreen")
    env.update(extra)
    return env


def cli(tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``clusterdeck ARGS`` from a fresh folder, as a user would type it."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=cwd, env=env or env_for(tmp_path),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def no_traceback(out: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in out.stdout + out.stderr, out.stderr[-3000:]


# --------------------------------------------------------------------------- command line basics


def test_version_is_the_package_version(tmp_path: Path) -> None:
    from importlib import metadata

    out = cli(tmp_path, "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"clusterdeck {metadata.version('clusterdeck')}"


@pytest.mark.parametrize(("typed", "suggested"), [("rnu", "'run'"), ("valdiate", "'validate'"), ("presest", "'presets'"),
                                                 ("data-2worker", "the preset 'data-2workers'")])
def test_a_mistyped_command_names_the_closest_and_opens_nothing(tmp_path: Path, typed: str, suggested: str) -> None:
    env = env_for(tmp_path)
    env.pop("QT_QPA_PLATFORM")
    env["DISPLAY"] = ":99"  # were the app started, Qt would abort on this display (exit 134)
    started = time.monotonic()
    out = cli(tmp_path, typed, env=env)
    assert out.returncode == 2, out.stderr
    assert f"unknown command {typed!r}" in out.stderr
    assert f"did you mean {suggested}" in out.stderr
    assert time.monotonic() - started < 20
    no_traceback(out)


def test_bare_command_without_a_display_explains_instead_of_aborting_in_qt(tmp_path: Path) -> None:
    env = {k: v for k, v in env_for(tmp_path).items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    for args in ((), ("gui",), ("data-2workers",)):
        out = cli(tmp_path, *args, env=env)
        assert out.returncode == 1, (args, out.returncode, out.stderr)
        assert "no display" in out.stderr and "clusterdeck run PRESET" in out.stderr
        no_traceback(out)


def test_presets_lists_every_bundled_preset_with_what_it_is(tmp_path: Path) -> None:
    out = cli(tmp_path, "presets")
    assert out.returncode == 0, out.stderr
    names = presets.bundled_names()
    assert "data-2workers" in names and "data-user-script" in names
    for name in names:
        line = next(x for x in out.stdout.splitlines() if x.startswith(name + " "))
        assert presets.description(presets.presets_dir() / f"{name}.yaml")[:30] in line


def test_every_bundled_preset_validates_from_an_unrelated_folder(tmp_path: Path) -> None:
    names = presets.bundled_names()
    out = cli(tmp_path, "validate", *names)
    assert out.returncode == 0, out.stderr
    assert [x.split(":")[0] for x in out.stdout.splitlines()] == names


# --------------------------------------------------------------------------- validate


def write_npz_preset(folder: Path, data_path: str) -> Path:
    cfg = config_mod.default_config()
    cfg = config_mod.replace(cfg, data=config_mod.replace(cfg.data, source="npz", path=data_path, shape=(4,), classes=2,
                                                          size=256))
    preset = folder / "npz.yaml"
    config_mod.save(cfg, preset)
    return preset


def test_validate_reads_a_presets_data_relative_to_the_preset(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    rng = np.random.default_rng(0)
    np.savez(project / "train.npz", x=rng.normal(size=(256, 4)).astype("float32"), y=rng.integers(0, 2, 256))
    preset = write_npz_preset(project, "train.npz")
    out = cli(tmp_path, "validate", str(preset))  # started in tmp_path/elsewhere: train.npz is not there
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"{preset}: ok")


def test_validate_reports_a_data_file_that_does_not_exist(tmp_path: Path) -> None:
    preset = write_npz_preset(tmp_path, "missing.npz")
    out = cli(tmp_path, "validate", str(preset))
    assert out.returncode == 2
    assert "data.path" in out.stderr and str(tmp_path / "missing.npz") in out.stderr
    assert ": ok" not in out.stdout
    no_traceback(out)


def test_validate_reports_a_user_script_that_does_not_exist(tmp_path: Path) -> None:
    cfg = config_mod.loads((presets.presets_dir() / "data-user-script.yaml").read_text(encoding="utf-8"))
    preset = tmp_path / "mine.yaml"
    config_mod.save(cfg, preset)  # still '../examples/user_script.py', now relative to tmp_path
    out = cli(tmp_path, "validate", str(preset))
    assert out.returncode == 2
    assert "model.script" in out.stderr and "no such file" in out.stderr
    no_traceback(out)


def test_validate_refuses_endless_and_blocking_files_within_seconds(tmp_path: Path) -> None:
    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    started = time.monotonic()
    out = cli(tmp_path, "validate", "/dev/zero", str(fifo), timeout=30)
    assert time.monotonic() - started < 15
    assert out.returncode == 2
    assert "/dev/zero: not a regular file" in out.stderr
    assert f"{fifo}: not a regular file" in out.stderr
    no_traceback(out)


def test_an_unknown_preset_name_lists_the_bundled_ones(tmp_path: Path) -> None:
    out = cli(tmp_path, "run", "data-2worker")
    assert out.returncode == 2
    assert "no such file or bundled preset; did you mean 'data-2workers'?" in out.stderr
    no_traceback(out)


# --------------------------------------------------------------------------- run: errors before a start


def test_run_json_prints_config_errors_as_json_lines(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster:\n  hosts:\n  - name: a\n    gpus: -2\n", encoding="utf-8")
    out = cli(tmp_path, "run", str(bad), "--json")
    assert out.returncode == 2
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    assert lines and all(e["kind"] == "error" and e["source"] == str(bad) for e in lines)
    assert {"field": "cluster.hosts[0].gpus", "message": "expected an integer >= 0, got -2"}.items() <= lines[0].items()
    no_traceback(out)


def test_run_json_reports_a_missing_data_file_as_json(tmp_path: Path) -> None:
    preset = write_npz_preset(tmp_path, "missing.npz")
    out = cli(tmp_path, "run", str(preset), "--json")
    assert out.returncode == 2
    errors = [json.loads(x) for x in out.stdout.splitlines()]
    assert any(e["kind"] == "error" and e["field"] == "data.path" for e in errors), out.stdout
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def read_only_folder(tmp_path: Path) -> Path | None:
    """A folder no run folder can be created in: a read-only mount as root, else a folder without write access."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o500)
        return folder
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)],
                             capture_output=True)
    return folder if mounted.returncode == 0 else None


def test_run_refuses_an_unusable_out_folder_with_a_message(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x", encoding="utf-8")
    out = cli(tmp_path, "run", "data-2workers", "--out", str(blocker / "runs"))
    assert out.returncode == 2
    assert f"--out: '{blocker / 'runs'}' cannot hold run folders: {blocker} is a file, not a folder" in out.stderr
    no_traceback(out)
    out = cli(tmp_path, "run", "data-2workers", "--json", env=env_for(tmp_path, CLUSTERDECK_RUNS=str(blocker)))
    assert out.returncode == 2
    error = json.loads(out.stdout)
    assert error["field"] == "$CLUSTERDECK_RUNS" and "is a file, not a folder" in error["message"]

    ro = read_only_folder(tmp_path)
    if ro is None:
        pytest.skip("no read-only folder can be made here")
    try:
        out = cli(tmp_path, "run", "data-2workers", "--out", str(ro / "runs"))
        assert out.returncode == 2
        assert "cannot hold run folders" in out.stderr
        assert "Read-only file system" in out.stderr or "Permission denied" in out.stderr
        no_traceback(out)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)], capture_output=True)
        else:
            ro.chmod(0o700)


# --------------------------------------------------------------------------- gui hand-over


@pytest.fixture
def fake_app(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A stand-in for ``python -m gui`` that records the arguments the command handed over."""
    pkg = tmp_path / "fake" / "gui"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    record = tmp_path / "argv.json"
    (pkg / "__main__.py").write_text(f"import json, sys\njson.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n",
                                     encoding="utf-8")
    env = env_for(tmp_path, PYTHONPATH=f"{tmp_path / 'fake'}{os.pathsep}{ROOT}")
    return env, record


def test_a_run_folder_opens_as_a_run_folder(tmp_path: Path, fake_app: tuple[dict[str, str], Path]) -> None:
    env, record = fake_app
    run_dir = tmp_path / "runs" / "20260101-000000-data-2workers"
    run_dir.mkdir(parents=True)
    config_mod.save(config_mod.default_config(), run_dir / "config.yaml")
    for args in (("gui", str(run_dir)), (str(run_dir),)):
        record.unlink(missing_ok=True)
        out = cli(tmp_path, *args, env=env)
        assert out.returncode == 0, out.stderr
        assert json.loads(record.read_text()) == ["--run-folder", str(run_dir)]


def test_a_preset_name_opens_the_bundled_file(tmp_path: Path, fake_app: tuple[dict[str, str], Path]) -> None:
    env, record = fake_app
    out = cli(tmp_path, "gui", "data-2workers", "--run", env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(record.read_text()) == [str((presets.presets_dir() / "data-2workers.yaml").resolve()), "--run"]


def test_gui_refuses_what_it_cannot_open_before_starting_the_app(tmp_path: Path,
                                                                 fake_app: tuple[dict[str, str], Path]) -> None:
    env, record = fake_app
    plain = tmp_path / "plain"
    plain.mkdir()
    for args, message in ((("gui", str(plain)), "not a run folder"), (("gui", "nosuch.yaml"), "no such file"),
                          (("gui", "data-2workrs"), "did you mean 'data-2workers'")):
        out = cli(tmp_path, *args, env=env)
        assert out.returncode == 2, (args, out.stderr)
        assert message in out.stderr
        assert not record.exists()
    no_display = {k: v for k, v in env.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    out = cli(tmp_path, "gui", "data-2workers", env=no_display)
    assert out.returncode == 1 and "no display" in out.stderr
    assert not record.exists()


# --------------------------------------------------------------------------- signals


def start_cli(tmp_path: Path, *args: str, **extra: str) -> tuple[subprocess.Popen[str], str]:
    """``clusterdeck ARGS`` in its own process group (a terminal's foreground job), tagged to find its children."""
    tag = uuid.uuid4().hex
    cwd = tmp_path / "elsewhere"
    cwd.mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", *args], cwd=cwd,
                            env=env_for(tmp_path, CLUSTERDECK_TEST_TAG=tag, **extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, tag


def tagged_processes(tag: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("CLUSTERDECK_TEST_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            continue
    return found


def wait_no_tagged(tag: str, timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (left := tagged_processes(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.parametrize("delay", [0.3, 0.6, 1.0])
def test_ctrl_c_in_the_first_second_exits_130_without_a_traceback(tmp_path: Path, delay: float) -> None:
    proc, tag = start_cli(tmp_path, "run", "data-2workers", "--steps", "100000")
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in out + err, err[-3000:]
    assert wait_no_tagged(tag, 10) == []


def test_ctrl_c_during_the_script_check_exits_130_and_starts_nothing(tmp_path: Path) -> None:
    proc, tag = start_cli(tmp_path, "run", "data-user-script", "--steps", "100000")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait for the check's own interpreter (it imports TensorFlow)
        if any("script_checker" in command_line(p) for p in tagged_processes(tag) if p.pid != proc.pid):
            break
        time.sleep(0.05)
    else:
        pytest.fail("the script check never started")
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in out + err, err[-3000:]
    assert "nothing was started" in err
    assert wait_no_tagged(tag, 10) == [], "the script check outlived the command"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.cluster
@pytest.mark.parametrize(("signum", "group"), [(signal.SIGINT, True), (signal.SIGTERM, False),
                                               (signal.SIGHUP, False)])
def test_a_signal_stops_a_started_run_like_stop(tmp_path: Path, signum: int, group: bool) -> None:
    proc, tag = start_cli(tmp_path, "run", "data-2workers", "--steps", "100000", "--json")
    assert proc.stdout is not None
    for line in proc.stdout:
        event = json.loads(line)
        if event["kind"] == "status" and event.get("pid"):
            break  # a task process is up
    if group:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err[-3000:]
    assert "Traceback" not in rest + err, err[-3000:]
    summary = json.loads(rest.splitlines()[-1])
    assert summary["kind"] == "summary" and summary["state"] == "stopped"
    meta = json.loads((Path(summary["run_dir"]) / "run.json").read_text(encoding="utf-8"))
    assert meta["state"] == "stopped"
    assert wait_no_tagged(tag, 10) == []


def test_export_puts_the_run_folder_on_the_named_claim(tmp_path: Path) -> None:
    import yaml

    out = cli(tmp_path, "export", "async-1ps", "--out", str(tmp_path / "exp"), "--image", "reg/clusterdeck:1",
              "--pvc", "runs-claim", "--pvc-size", "5Gi")
    assert out.returncode == 0, out.stderr
    job = yaml.safe_load((tmp_path / "exp" / "tfjob.yaml").read_text())
    specs = job["spec"]["tfReplicaSpecs"]
    for spec in specs.values():
        claims = [v["persistentVolumeClaim"]["claimName"] for v in spec["template"]["spec"]["volumes"]
                  if "persistentVolumeClaim" in v]
        assert claims == ["runs-claim"]
    pvc = yaml.safe_load((tmp_path / "exp" / "pvc.yaml").read_text())
    assert pvc["metadata"]["name"] == "runs-claim"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "5Gi"


def test_validate_says_when_local_tasks_outnumber_the_cpus_but_accepts_the_preset(tmp_path: Path) -> None:
    import os

    import yaml

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = cpus + 1
    preset = tmp_path / "crowded.yaml"
    preset.write_text(yaml.safe_dump({
        "name": "crowded",
        "cluster": {"hosts": [{"name": "local", "address": "localhost",
                               "tasks": [{"role": "worker", "index": i} for i in range(workers)]}]},
        "training": {"global_batch_size": 16 * workers, "steps": 5},
    }))
    out = cli(tmp_path, "validate", str(preset))
    assert out.returncode == 0, out.stderr
    assert "warning" in out.stderr and f"{workers} tasks share this machine" in out.stderr


def test_run_program_runs_a_users_script_on_a_presets_cluster(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import sys\nimport clusterdeck\n"
                      "for step in range(1, 4):\n"
                      "    clusterdeck.report(step, loss=1.0 / step, metrics={'accuracy': step / 4}, total=3)\n"
                      "print('args', sys.argv[1:])\n", encoding="utf-8")
    out = cli(tmp_path, "run", "program-custom-training", "--out", str(tmp_path / "runs"), "--program", str(script),
              "--", "--lr", "0.1")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "finished after 3 of 3 steps" in out.stdout
    assert "accuracy 0.75" in out.stdout
    log = next((tmp_path / "runs").glob("*/tasks/worker-0/log.txt")).read_text(encoding="utf-8")
    assert "args ['--lr', '0.1']" in log


def test_run_detach_reports_what_the_launcher_refused_and_leaves_no_run_folder(tmp_path: Path) -> None:
    preset = write_npz_preset(tmp_path, "missing.npz")
    out = cli(tmp_path, "run", str(preset), "--detach")
    no_traceback(out)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "data.path" in out.stderr and str(tmp_path / "missing.npz") in out.stderr
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir()), list(runs.iterdir())
    out = cli(tmp_path, "ls")
    assert out.returncode == 0 and "no runs" in out.stdout, out.stdout


def test_validate_checks_many_scripted_presets_side_by_side_and_says_each_in_the_order_given(tmp_path: Path) -> None:
    """The script checks (each a process importing TensorFlow) run at once: two presets' model scripts each wait
    for the other's mark, which only comes where both checks run together. What is said keeps the presets' order,
    a broken script is named with its own error, and a preset that is not there does not stop the others."""
    import os

    import yaml

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: the checks run one after the other")
    example = ROOT / "examples" / "user_script.py"
    marks = tmp_path / "marks"
    marks.mkdir()

    def preset(name: str, body: str) -> Path:
        script = tmp_path / f"{name}_model.py"
        script.write_text(body, encoding="utf-8")
        loaded = yaml.safe_load((ROOT / "presets" / "data-user-script.yaml").read_text(encoding="utf-8"))
        loaded.update(name=name)
        loaded["model"]["script"] = str(script)
        loaded["data"]["path"] = str(example)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(loaded), encoding="utf-8")
        return path

    def waits_for(me: str, other: str) -> str:
        return (f"import pathlib, time\nmarks = pathlib.Path({str(marks)!r})\n(marks / {me!r}).touch()\n"
                f"deadline = time.monotonic() + 40\n"
                f"while not (marks / {other!r}).exists() and time.monotonic() < deadline:\n    time.sleep(0.05)\n"
                f"(marks / '{me}-saw').write_text(str((marks / {other!r}).exists()))\n"
                f"exec(compile(open({str(example)!r}).read(), {str(example)!r}, 'exec'))\n")

    first, second = preset("first", waits_for("first", "second")), preset("second", waits_for("second", "first"))
    broken = preset("broken", "raise RuntimeError('this model file is broken on purpose')\n")
    out = cli(tmp_path, "validate", str(first), str(second), str(broken), "no-such-preset", timeout=240)
    assert out.returncode == 2, out.stdout + out.stderr
    assert [line.split(":")[0] for line in out.stdout.splitlines()] == [str(first), str(second)], out.stdout
    assert (marks / "first-saw").read_text() == "True" and (marks / "second-saw").read_text() == "True"
    assert "this model file is broken on purpose" in out.stderr and "model.script" in out.stderr, out.stderr
    assert out.stderr.index("this model file is broken") < out.stderr.index("no-such-preset"), out.stderr
