"""Live latency: from a task emitting a metric to the desktop app's curve holding it, beside TensorBoard.

One real run (preset ``data-1worker-2gpus`` by default) is launched from the real
desktop app (offscreen Qt), while ``tensorboard --logdir RUNS --host 127.0.0.1``
(default reload settings) watches the same runs folder. For every point of
replica 0's loss:

- *ClusterDeck*: the event's own ``t`` (set by the task when it emits the step
  event) to the moment the plots panel's ``redrawn`` signal finds the point in
  the loss curve's data (``MetricPlot.points``);
- *TensorBoard*: the same ``t`` to the moment TensorBoard's HTTP data API
  (``GET /data/plugin/scalars/scalars?run=…/replica_0&tag=loss``, the route its
  scalar dashboard reads) first serves that step; polled every 100 ms.

Both clocks are this machine's wall clock. Prints median and p99 of each and the
ratio of medians (goal: ClusterDeck's median <= 50 ms and >= 100x lower).

    python bench/live_latency.py [--seconds 45] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_doc_flags, free_port, machine_line, median, percentile, verdict, want_doc, write_section  # noqa: E402

import gui  # noqa: E402,F401 - guards the Qt binding before any Qt call
from engine.contract import config as config_mod  # noqa: E402
from engine.contract.presets import resolve_preset  # noqa: E402

GOAL_MEDIAN_S = 0.050
GOAL_FACTOR = 100.0
TAG = "loss"  # TensorBoard's convention: a run per replica (tensorboard/replica_<id>), plain tags
POLL_S = 0.1


class TensorBoardWatch:
    """A TensorBoard server on 127.0.0.1 and a thread recording when each step of one scalar is first served."""

    def __init__(self, logdir: Path) -> None:
        self.port = free_port()
        exe = shutil.which("tensorboard")
        cmd = [exe] if exe else [sys.executable, "-m", "tensorboard.main"]
        cmd += ["--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(self.port)]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.first_seen: dict[int, float] = {}
        self.run: str | None = None
        self.polls = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str, timeout: float = 5.0) -> Any:
        with urllib.request.urlopen(self.url(path), timeout=timeout) as resp:
            return json.loads(resp.read())

    def wait_ready(self, timeout: float = 120.0) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise SystemExit(f"tensorboard exited: {self.log.read().decode(errors='replace')[-2000:]}")
            try:
                self.get("/data/runs", timeout=1.0)
                return time.monotonic() - start
            except (urllib.error.URLError, OSError, ValueError):
                time.sleep(0.2)
        raise SystemExit("tensorboard did not answer in time")

    def watch(self, run: str) -> None:
        self.run = run
        self._thread = threading.Thread(target=self._poll, name="tensorboard-poll", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        query = urllib.parse.urlencode({"run": self.run, "tag": TAG})
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                values = self.get(f"/data/plugin/scalars/scalars?{query}")
                now = time.time()
                self.polls += 1
                for _wall, step, _value in values:
                    self.first_seen.setdefault(int(step), now)
            except (urllib.error.URLError, OSError, ValueError):
                self.errors += 1  # 400/404 until TensorBoard has loaded the run
            self._stop.wait(max(0.0, POLL_S - (time.monotonic() - started)))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(5)
        self.log.close()


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=None, help="seconds of training watched (default 45, quick 12)")
    parser.add_argument("--drain", type=float, default=None,
                        help="seconds TensorBoard is still polled after the run stopped (default 12, quick 7)")
    parser.add_argument("--preset", default="data-1worker-2gpus")
    add_doc_flags(parser)
    args = parser.parse_args(argv)
    seconds = args.seconds or (12.0 if args.quick else 45.0)
    drain = args.drain if args.drain is not None else (7.0 if args.quick else 12.0)

    from PySide6.QtCore import QEventLoop, QSettings, QTimer

    from gui.app import application
    from gui.controller import Controller
    from gui.main_window import MainWindow

    cfg = config_mod.load(resolve_preset(args.preset))
    cfg = config_mod.replace(cfg, training=config_mod.replace(cfg.training, steps=10_000_000, epochs=None,
                                                              checkpoint_every=0))
    tmp = Path(tempfile.mkdtemp(prefix="cd-latency-"))
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp / "settings"))
    runs_root = tmp / "runs"
    runs_root.mkdir()
    tb = TensorBoardWatch(runs_root)
    try:
        ready = tb.wait_ready()
        print(f"tensorboard {tb.url('/')} ready after {ready:.1f} s (default reload interval); {machine_line()}",
              flush=True)
        application()
        controller = Controller(cfg, runs_root=runs_root)
        window = MainWindow(controller)
        window.show()
        loss = window.plots.loss
        key = "replica/0/loss"
        gui_latency: list[float] = []
        seen = {"n": 0}
        phase = {"name": "starting", "first_step": 0.0, "stop_at": 0.0}

        def on_redrawn() -> None:
            now = time.time()
            n = loss.points(key)  # points the loss curve holds (the screen may show fewer, downsampled)
            if n > seen["n"]:
                series = controller.state.history.series[key]
                # the stored times of the new points only (Series.t would make every point's absolute time)
                gui_latency.extend(((now - series.t_base) - series.t_rel[seen["n"]:n].astype(float)).tolist())
                seen["n"] = n

        window.plots.redrawn.connect(on_redrawn)
        run_dir = controller.start_run()
        tb.watch(f"{run_dir.name}/tensorboard/replica_0")

        def tick() -> None:
            now = time.monotonic()
            if phase["name"] == "starting" and controller.state.first_step_at is not None:
                phase.update(name="training", first_step=now, stop_at=now + seconds)
                print(f"first step; watching {seconds:.0f} s of training", flush=True)
            elif phase["name"] == "training" and now >= phase["stop_at"]:
                phase["name"] = "stopping"
                controller.stop_run()
            elif phase["name"] == "stopping" and controller.run is None:
                phase.update(name="draining", stop_at=now + drain)
            elif phase["name"] == "draining" and now >= phase["stop_at"]:
                ticker.stop()
                loop.quit()

        loop = QEventLoop()
        ticker = QTimer()
        ticker.setInterval(100)
        ticker.timeout.connect(tick)
        ticker.start()
        loop.exec()  # a local loop: QApplication.quit() would try to close the window
        series = controller.state.history.series[key]
        emitted = dict(zip(series.x.astype(int).tolist(), series.t.tolist(), strict=True))
        tb_latency = [tb.first_seen[s] - t for s, t in emitted.items() if s in tb.first_seen]
        never = sum(1 for s in emitted if s not in tb.first_seen)
        window.plots.stop()
        controller.undo_stack.setClean()
        window.close()
    finally:
        tb.close()
        shutil.rmtree(tmp, ignore_errors=True)

    if gui_latency and not tb_latency:  # the app's side stands on its own: say it before giving up
        print(f"ClusterDeck app alone: {len(gui_latency)} points, median {median(gui_latency) * 1e3:.1f} ms, "
              f"p99 {percentile(gui_latency, 99) * 1e3:.1f} ms, max {max(gui_latency) * 1e3:.1f} ms")
    if not gui_latency or not tb_latency:
        raise SystemExit(f"no latency measured (app: {len(gui_latency)} points, tensorboard: {len(tb_latency)} "
                         f"points, {tb.polls} polls, {tb.errors} failed)")
    g_med, g_p99 = median(gui_latency), percentile(gui_latency, 99)
    t_med, t_p99 = median(tb_latency), percentile(tb_latency, 99)
    factor = t_med / g_med
    figures = {"app_median_ms": g_med * 1e3, "app_p99_ms": g_p99 * 1e3, "tensorboard_median_ms": t_med * 1e3,
               "tensorboard_p99_ms": t_p99 * 1e3, "factor": factor, "points": len(gui_latency),
               "tensorboard_points": len(tb_latency), "tensorboard_never": never}
    print(f"{'':<12} {'points':>7} {'median ms':>10} {'p99 ms':>9} {'max ms':>9}")
    print(f"{'ClusterDeck':<12} {len(gui_latency):>7} {g_med * 1e3:>10.1f} {g_p99 * 1e3:>9.1f} "
          f"{max(gui_latency) * 1e3:>9.1f}")
    print(f"{'TensorBoard':<12} {len(tb_latency):>7} {t_med * 1e3:>10.1f} {t_p99 * 1e3:>9.1f} "
          f"{max(tb_latency) * 1e3:>9.1f}   ({never} of the app's points never served: summaries keep 2 a second)")
    print(f"TensorBoard / ClusterDeck median latency: {factor:.0f}x  (goals: median <= {GOAL_MEDIAN_S * 1e3:.0f} ms, "
          f">= {GOAL_FACTOR:.0f}x)")
    if want_doc(args):
        write_section("live_latency", _doc(args.preset, seconds, figures, gui_latency, tb_latency), args.doc)
    return figures


def _doc(preset: str, seconds: float, f: dict[str, float], app: list[float], tb: list[float]) -> str:
    return "\n".join([
        "## 2. Live latency",
        "",
        f"`python bench/live_latency.py` — one real run of preset `{preset}` launched from the desktop app (offscreen "
        f"Qt), {seconds:.0f} s of training watched, while `tensorboard --logdir RUNS --host 127.0.0.1` (default "
        f"reload settings) serves the same run's summaries; {machine_line()}. Latency of each point of replica 0's "
        "loss, from the event's `t` (stamped by the task as it emits the step) to the moment the point is in the "
        "loss curve's data (ClusterDeck: checked on every redraw of the plots panel) or is first served by "
        "TensorBoard's data API `GET /data/plugin/scalars/scalars?run=…/replica_0&tag=loss` (polled every 100 ms).",
        "",
        "| | points | median | p99 | max |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| ClusterDeck app | {len(app)} | **{f['app_median_ms']:.1f} ms** | {f['app_p99_ms']:.1f} ms | "
        f"{max(app) * 1e3:.1f} ms |",
        f"| TensorBoard server | {len(tb)} | {f['tensorboard_median_ms']:.0f} ms | {f['tensorboard_p99_ms']:.0f} ms | "
        f"{max(tb) * 1e3:.0f} ms |",
        "",
        f"- ClusterDeck median <= {GOAL_MEDIAN_S * 1e3:.0f} ms: {verdict(f['app_median_ms'] <= GOAL_MEDIAN_S * 1e3)}.",
        f"- TensorBoard / ClusterDeck, medians: **{f['factor']:.0f}x** (goal >= {GOAL_FACTOR:.0f}x: "
        f"{verdict(f['factor'] >= GOAL_FACTOR)}).",
        f"- {int(f['tensorboard_never'])} of the app's points were never served by TensorBoard: the run's summaries "
        "keep at most 2 points a second per replica (`engine/runtime/summaries.py`, `INTERVAL_S`) where the app "
        "shows every step event (`training.metrics_hz`, 20 a second), and a stopped task's last unflushed points "
        "are lost. They are left out of its figures, which flatters it.",
        "",
        "Where the time goes: the task stamps `t`, writes the line to its `events.jsonl` and its pipe; the supervisor "
        "relays it on its stdout; the launcher's reader thread decodes it and its dispatcher hands it to the app's "
        "queue; the controller folds queued events into its `RunState` and the plots panel pushes new points into "
        "the curves in the same timer tick, at most 30 times a second. TensorBoard waits for the summary writer's "
        "flush (every 2 s) and for its own reload (every 5 s) before the point can be served.",
    ])


if __name__ == "__main__":
    main()
