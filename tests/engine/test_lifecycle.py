"""The run lifecycle policy, fed event lists: finish, fail and blame, restart, stop, hangs."""

from __future__ import annotations

from typing import Any

import pytest

from engine.contract import events
from engine.control import lifecycle as lc
from engine.control.lifecycle import EndState, Lifecycle, Outcome, TaskInfo, TaskPhase

DATA = [TaskInfo("worker:0", "worker", "local"), TaskInfo("worker:1", "worker", "local")]
ASYNC = [TaskInfo("chief:0", "chief", "local"), TaskInfo("ps:0", "ps", "local"),
         TaskInfo("worker:0", "worker", "local"), TaskInfo("worker:1", "worker", "local")]


def status(task: str, state: str, **fields: Any) -> dict[str, Any]:
    return events.make("status", task, state=state, **fields)


def step(task: str, n: int, **fields: Any) -> dict[str, Any]:
    return events.make("step", task, replica=0, step=n, loss=1.0, **fields)


def feed(policy: Lifecycle, items: list[Any], now: float = 0.0) -> list[lc.Action]:
    """Feed decoded events (dicts, through the real decoder) or policy inputs; every action, in order."""
    out: list[lc.Action] = []
    for item in items:
        if isinstance(item, dict):
            decoded = events.decode(events.encode(item))
            assert decoded is not None, item
            policy_input = lc.from_event(decoded)
            if policy_input is None:
                continue
            item = policy_input
        out += policy.feed(item, now)
    return out


def started(tasks: list[TaskInfo] = DATA, mode: str = "data", **kw: Any) -> Lifecycle:
    policy = Lifecycle(tasks, mode=mode, **kw)
    feed(policy, [status(t.name, "starting") for t in tasks])
    policy.started()
    return policy


def test_a_run_finishes_once_every_primary_task_finished() -> None:
    policy = started()
    assert feed(policy, [status("worker:0", "finished")]) == []
    actions = feed(policy, [status("worker:1", "finished")])
    assert actions == [lc.StopRun(Outcome(EndState.FINISHED))]
    assert policy.final() == Outcome(EndState.FINISHED)
    # what the tasks still running are reported as: finished, never "stopped by the user"
    assert policy.final().task_state is TaskPhase.FINISHED and policy.final().task_reason == ""


def test_async_runs_finish_with_their_chief_and_the_servers_read_finished() -> None:
    policy = started(ASYNC, "async")
    (action,) = feed(policy, [status("chief:0", "finished")])
    assert isinstance(action, lc.StopRun) and action.outcome.state is EndState.FINISHED
    assert action.outcome.task_state is TaskPhase.FINISHED


def test_a_failed_task_fails_the_run_and_the_others_read_stopped_because_it_failed() -> None:
    policy = started()
    (action,) = feed(policy, [status("worker:1", "failed", reason="killed by SIGKILL")])
    assert action == lc.StopRun(Outcome(EndState.FAILED, "killed by SIGKILL", "worker:1"))
    assert action.outcome.task_state is TaskPhase.STOPPED
    assert action.outcome.task_reason == "stopped because worker:1 failed"
    assert action.outcome.event_fields() == {"state": "failed", "reason": "killed by SIGKILL",
                                             "failed_task": "worker:1"}
    # later failures (the peers' collective errors) change nothing
    assert feed(policy, [status("worker:0", "failed", reason="UnavailableError")]) == []
    assert policy.final().failed_task == "worker:1"


def test_the_reason_never_repeats_the_task_name() -> None:
    policy = started()
    (action,) = feed(policy, [status("worker:1", "failed", reason="worker:1: killed by SIGKILL")])
    assert isinstance(action, lc.StopRun)
    assert f"{action.outcome.failed_task}: {action.outcome.reason}" == "worker:1: killed by SIGKILL"


def test_blame_names_the_task_tensorflow_found_unhealthy() -> None:
    reason = ("UnavailableError: Collective ops is aborted by: Error reported from /job:worker/task:1: The "
              "following tasks are unhealthy (stopped sending heartbeats): /job:worker/replica:0/task:1")
    policy = started()
    # a peer's report waits a moment for the culprit's own words ...
    assert feed(policy, [status("worker:0", "failed", reason=reason)], now=10.0) == []
    assert feed(policy, [lc.Tick()], now=10.0 + lc.SECONDHAND_GRACE_S - 0.1) == []
    # ... and, when none come, fails the run naming the culprit
    (action,) = feed(policy, [lc.Tick()], now=10.0 + lc.SECONDHAND_GRACE_S)
    assert isinstance(action, lc.StopRun)
    assert action.outcome.failed_task == "worker:1"
    assert "stopped responding" in action.outcome.reason and "reported by worker:0" in action.outcome.reason
    assert lc.blame("worker:0", "ValueError: bad shape") == ("worker:0", "ValueError: bad shape")


def test_the_culprits_own_words_beat_a_peers_report_of_it() -> None:
    reason = "UnavailableError: Collective ops is aborted by: /job:worker/replica:0/task:1 unhealthy"
    policy = started()
    assert feed(policy, [status("worker:0", "failed", reason=reason)], now=10.0) == []
    (action,) = feed(policy, [status("worker:1", "failed", reason="killed by SIGKILL")], now=11.0)
    assert action == lc.StopRun(Outcome(EndState.FAILED, "killed by SIGKILL", "worker:1"))
    # a run whose supervisors all ended before the grace did still names the culprit
    policy = started()
    feed(policy, [status("worker:0", "failed", reason=reason)], now=10.0)
    assert policy.final() == Outcome(EndState.FAILED, policy.secondhand[1], "worker:1")


def test_a_worker_its_supervisor_restarts_does_not_end_the_run() -> None:
    policy = started(ASYNC, "async")
    assert feed(policy, [status("worker:1", "failed", reason="killed by SIGKILL", will_restart=True),
                         status("worker:1", "restarting"), status("worker:1", "starting")]) == []
    assert policy.outcome is None


def test_restarts_restart_the_whole_run_then_fail_it() -> None:
    policy = started(restarts_allowed=1)
    (action,) = feed(policy, [status("worker:1", "failed", reason="killed by SIGKILL")])
    assert action == lc.RestartRun("worker:1: killed by SIGKILL", 1, 1)
    policy.restart_started(now=1.0)
    # the old generation's last words are not the new one's business
    assert feed(policy, [status("worker:0", "failed", reason="UnavailableError")]) == []
    assert policy.restart_done() == []
    new = [dict(status(t.name, "starting"), generation=1) for t in DATA]
    feed(policy, new)
    (end,) = feed(policy, [dict(status("worker:0", "failed", reason="exited with code 1"), generation=1)])
    assert isinstance(end, lc.StopRun) and end.outcome == Outcome(EndState.FAILED, "exited with code 1", "worker:0")


def test_a_failure_met_while_restarting_fails_the_run_once_it_is_up() -> None:
    policy = started(restarts_allowed=1)
    feed(policy, [status("worker:1", "failed", reason="killed")])
    policy.restart_started(now=1.0)
    assert policy.feed(lc.LauncherFailed("disk full"), 1.0)  # the launcher's own failure ends it at once
    policy2 = started(restarts_allowed=1)
    feed(policy2, [status("worker:1", "failed", reason="killed")])
    policy2.restart_started(now=1.0)
    assert policy2.feed(lc.SupervisorExited("localhost", -9, "the supervisor was killed by SIGKILL",
                                            ("worker:0",), 1), 1.0) == []
    (action,) = policy2.restart_done()
    assert isinstance(action, lc.StopRun) and action.outcome.failed_task == "supervisor@localhost"


def test_the_user_stop_wins_and_the_tasks_read_stopped_by_the_user() -> None:
    policy = started()
    (action,) = policy.feed(lc.StopRequested(), 0.0)
    assert action == lc.StopRun(Outcome(EndState.STOPPED, "stopped by the user"))
    assert action.outcome.task_reason == "stopped by the user"
    assert feed(policy, [status("worker:0", "finished"), status("worker:1", "finished")]) == []
    assert policy.final().state is EndState.STOPPED
    assert policy.feed(lc.StopRequested("again"), 0.0) == []


def test_a_killed_supervisor_is_blamed_with_its_own_message() -> None:
    policy = started()
    (action,) = policy.feed(lc.SupervisorExited("localhost", -9, "the supervisor was killed by SIGKILL",
                                                ("worker:0", "worker:1")), 0.0)
    assert isinstance(action, lc.StopRun)
    assert action.outcome == Outcome(EndState.FAILED, "the supervisor was killed by SIGKILL", "supervisor@localhost")


def test_a_supervisor_that_ends_after_its_tasks_is_no_failure() -> None:
    policy = started()
    feed(policy, [status("worker:0", "finished"), status("worker:1", "finished")])
    assert policy.feed(lc.SupervisorExited("localhost", 0, "", ("worker:0", "worker:1")), 0.0) == []
    assert policy.final().state is EndState.FINISHED


def test_without_any_decision_the_end_names_the_task_that_did_not_finish() -> None:
    policy = started()
    feed(policy, [status("worker:0", "finished")])
    assert policy.final() == Outcome(EndState.FAILED, "ended without finishing", "worker:1")


def test_a_folder_or_transport_failure_fails_the_run() -> None:
    policy = started(restarts_allowed=3)
    (action,) = policy.feed(lc.LauncherFailed("the run folder cannot be written (No space left on device)"), 0.0)
    assert isinstance(action, lc.StopRun)
    assert action.outcome.failed_task == "launcher" and "No space left" in action.outcome.reason
    policy = started()
    (action,) = policy.feed(lc.TransportFailed("gpu", "job killed by its time limit"), 0.0)
    assert isinstance(action, lc.StopRun)
    assert action.outcome == Outcome(EndState.FAILED, "job killed by its time limit", "supervisor@gpu")


def test_a_synchronous_run_without_progress_fails_naming_the_spinning_task() -> None:
    policy = started(progress_timeout_s=10.0)
    feed(policy, [step("worker:0", 1), step("worker:1", 1)], now=1.0)
    assert policy.feed(lc.Tick(), 10.5) == []
    feed(policy, [events.make("device", "worker:0", cpu_percent=2.0),
                  events.make("device", "worker:1", cpu_percent=99.0)], now=11.0)  # its supervisor samples on
    (action,) = policy.feed(lc.Tick(), 11.5)
    assert isinstance(action, lc.StopRun) and action.outcome.failed_task == "worker:1"
    assert "no progress for 10 s" in action.outcome.reason and "last step 1" in action.outcome.reason


def test_the_first_step_gets_longer_and_a_task_behind_is_blamed_when_none_spins() -> None:
    policy = started(progress_timeout_s=10.0)
    assert policy.feed(lc.Tick(), 29.0) == []  # 3x for the first step
    feed(policy, [step("worker:0", 5)], now=29.5)
    assert policy.feed(lc.Tick(), 39.0) == []
    (action,) = policy.feed(lc.Tick(), 40.0)
    assert isinstance(action, lc.StopRun) and action.outcome.failed_task == "worker:1"
    never = started(progress_timeout_s=10.0)
    (action,) = never.feed(lc.Tick(), 31.0)
    assert isinstance(action, lc.StopRun) and "no first step within 30 s" in action.outcome.reason


def test_a_first_step_hang_blames_the_task_that_never_reached_its_loop_when_none_spins() -> None:
    # worker:0 built its model and waits in its first step; worker:1 never said it runs (stuck while building,
    # its CPU starved or blocked): worker:1 is behind, whatever their order
    for ready in ("worker:0", "worker:1"):
        policy = started(progress_timeout_s=10.0)
        feed(policy, [status(ready, "running", step=0, total=100)], now=1.0)
        feed(policy, [events.make("device", "worker:0", cpu_percent=0.0),
                      events.make("device", "worker:1", cpu_percent=0.0)], now=30.5)  # its supervisor samples on
        (action,) = policy.feed(lc.Tick(), 31.0)
        other = "worker:1" if ready == "worker:0" else "worker:0"
        assert isinstance(action, lc.StopRun) and action.outcome.failed_task == other
        assert "no first step within 30 s" in action.outcome.reason


def test_a_spinning_task_starved_of_its_core_for_its_last_seconds_is_still_named() -> None:
    # a CI trace: worker:1 spun in build_model at ~100 % of its pinned core, then other work took the core and it got
    # 0-20 % for its last seconds, its very last sample 0 %; worker:0 waited at 0 % throughout
    spinning = [97.2, 99.2, 95.5, 98.9, 99.7, 97.7, 99.8, 99.7, 99.6, 101.2, 93.3, 97.2, 101.2, 99.2, 99.2, 81.7,
                65.8, 55.8, 69.8, 43.9, 33.9, 25.9, 12.0, 0.0, 1.1, 19.7, 7.9, 8.0, 0.0, 0.0, 0.0, 9.9, 21.9, 0.0]
    policy = started(progress_timeout_s=6.0)
    for i, cpu in enumerate(spinning):
        feed(policy, [events.make("device", "worker:0", cpu_percent=2.0 if i == 20 else 0.0),
                      events.make("device", "worker:1", cpu_percent=cpu)], now=1.0 + 0.5 * i)
    (action,) = policy.feed(lc.Tick(), 18.5)
    assert isinstance(action, lc.StopRun) and action.outcome.failed_task == "worker:1", action
    assert "no first step within 18 s" in action.outcome.reason


def test_zero_disables_the_progress_check() -> None:
    policy = started(progress_timeout_s=0.0)
    assert policy.feed(lc.Tick(), 1e9) == []


def test_an_async_worker_without_steps_is_restarted_and_a_hung_chief_fails_the_run() -> None:
    policy = started(ASYNC, "async", progress_timeout_s=10.0)
    for t in range(1, 40):
        feed(policy, [step("chief:0", t, worker=0)], now=float(t))
        actions = policy.feed(lc.Tick(), float(t))
        if actions:
            break
    assert actions == [lc.RestartTask("worker:1", actions[0].reason)]  # type: ignore[union-attr]
    assert t == 31 and "no first step" in actions[0].reason  # type: ignore[union-attr]
    assert policy.feed(lc.Tick(), 32.0) == []  # its restart has a fresh clock
    (end,) = policy.feed(lc.Tick(), 39.0 + 10.5)
    assert isinstance(end, lc.StopRun) and end.outcome.failed_task == "chief:0"


def test_a_hung_async_worker_of_grouped_steps_is_told_what_to_change() -> None:
    policy = started(ASYNC, "async", progress_timeout_s=10.0, steps_per_execution=16)
    feed(policy, [step("chief:0", 16, worker=0), step("chief:0", 32, worker=1)], now=1.0)
    for t in range(2, 40):
        feed(policy, [step("chief:0", 32 + 16 * t, worker=0)], now=float(t))
        actions = policy.feed(lc.Tick(), float(t))
        if actions:
            break
    (restart,) = actions
    assert isinstance(restart, lc.RestartTask) and restart.task == "worker:1"
    assert "no progress for 10 s" in restart.reason and "last step 32" in restart.reason
    assert "once per 16 steps (training.steps_per_execution)" in restart.reason
    assert "lower it or raise the timeout" in restart.reason


def test_events_of_every_kind_pass_the_real_decoder() -> None:
    for event in (status("worker:0", "failed", reason="x", will_restart=True), step("chief:0", 3, worker=1),
                  events.make("device", "worker:0", cpu_percent=3.5)):
        decoded = events.decode(events.encode(event))
        assert decoded is not None and lc.from_event(decoded) is not None
    assert lc.from_event({"kind": "status", "task": "w", "state": "bogus"}) is None


@pytest.mark.parametrize("reason,expected", [("worker:1: worker:1: boom", "boom"), ("boom", "boom"),
                                             ("worker:10: x", "worker:10: x")])
def test_without_name(reason: str, expected: str) -> None:
    assert lc.without_name("worker:1", reason) == expected


def test_a_hung_data_task_of_grouped_steps_is_told_what_to_change() -> None:
    policy = started(progress_timeout_s=10.0, steps_per_execution=16)
    feed(policy, [step("worker:0", 16), step("worker:1", 16)], now=1.0)
    (action,) = policy.feed(lc.Tick(), 11.5)
    assert isinstance(action, lc.StopRun)
    assert "a task reports once per 16 steps (training.steps_per_execution)" in action.outcome.reason
    single = started(progress_timeout_s=10.0)
    feed(single, [step("worker:0", 1), step("worker:1", 1)], now=1.0)
    (action,) = single.feed(lc.Tick(), 11.5)
    assert "steps_per_execution" not in action.outcome.reason


# -- hosts of other machines: probed when silent, a lost async worker host started again

LAB = [TaskInfo("worker:0", "worker", "lab1"), TaskInfo("worker:1", "worker", "lab2")]
LAB_ASYNC = [TaskInfo("chief:0", "chief", "lab1"), TaskInfo("ps:0", "ps", "lab1"),
             TaskInfo("worker:0", "worker", "lab2"), TaskInfo("worker:1", "worker", "lab3")]


def sampled(policy: Lifecycle, tasks: list[TaskInfo], now: float) -> None:
    """Every task's supervisor samples it (what makes a host's silence mean something)."""
    feed(policy, [events.make("device", t.name, cpu_percent=50.0) for t in tasks], now=now)


def test_a_silent_remote_host_is_probed_and_one_that_does_not_answer_fails_a_synchronous_run_naming_it() -> None:
    policy = started(LAB, remote_hosts=["lab1", "lab2"])
    sampled(policy, LAB, 1.0)
    assert policy.feed(lc.Tick(), 1.0 + lc.HOST_PROBE_AFTER_S) == []  # quiet for a moment: nothing asked
    sampled(policy, LAB[:1], 3.5)  # lab1 speaks on, lab2 went silent at 1.0
    assert policy.feed(lc.Tick(), 3.5) == [lc.ProbeHost("lab2")]
    assert policy.feed(lc.Tick(), 4.0) == []  # asked once per HOST_PROBE_EVERY_S
    assert policy.feed(lc.HostProbed("lab2", ""), 4.0) == []  # it answers: the progress rules judge a quiet host
    sampled(policy, LAB[:1], 6.0)
    assert policy.feed(lc.Tick(), 3.5 + lc.HOST_PROBE_EVERY_S) == [lc.ProbeHost("lab2")]
    (action,) = policy.feed(lc.HostProbed("lab2", "no answer from 10.99.0.12 (port 4001) within 1.5 s"), 7.0)
    assert isinstance(action, lc.StopRun) and action.outcome.failed_task == "supervisor@lab2"
    reason = action.outcome.reason
    assert reason.startswith("host lab2 does not answer: no answer from 10.99.0.12") and "worker:1 on it" in reason
    # the same silence on a host of this machine, or one whose supervisor ended, asks nothing
    here = started(LAB)
    sampled(here, LAB, 1.0)
    assert here.feed(lc.Tick(), 10.0) == []


def test_a_peers_heartbeat_report_of_a_task_on_a_host_that_does_not_answer_names_the_host() -> None:
    reason = ("UnavailableError: Collective ops is aborted by: Error reported from /job:worker/task:1: The "
              "following tasks are unhealthy (stopped sending heartbeats): /job:worker/replica:0/task:1")
    policy = started(LAB, remote_hosts=["lab1", "lab2"])
    sampled(policy, LAB, 1.0)
    sampled(policy, LAB[:1], 3.5)
    assert policy.feed(lc.Tick(), 3.5) == [lc.ProbeHost("lab2")]
    # the report comes while lab2 is being asked about: its grace waits for the answer
    assert feed(policy, [status("worker:0", "failed", reason=reason)], now=4.0) == []
    assert policy.feed(lc.Tick(), 4.0 + lc.SECONDHAND_GRACE_S) == []
    (action,) = policy.feed(lc.HostProbed("lab2", "no answer from 10.99.0.12 (port 4001) within 1.5 s"), 7.5)
    assert isinstance(action, lc.StopRun) and action.outcome.failed_task == "supervisor@lab2"
    assert action.outcome.reason.startswith("host lab2 does not answer")
    # a host that answers: the grace ends as before, the task blamed through TensorFlow's words
    policy = started(LAB, remote_hosts=["lab1", "lab2"])
    sampled(policy, LAB, 1.0)
    sampled(policy, LAB[:1], 3.5)
    policy.feed(lc.Tick(), 3.5)
    feed(policy, [status("worker:0", "failed", reason=reason)], now=4.0)
    assert policy.feed(lc.HostProbed("lab2", ""), 4.1) == []
    (stop,) = policy.feed(lc.Tick(), 4.0 + lc.SECONDHAND_GRACE_S)
    assert isinstance(stop, lc.StopRun) and stop.outcome.failed_task == "worker:1"


def test_an_async_host_of_workers_that_does_not_answer_is_named_not_failed_and_said_back() -> None:
    policy = started(LAB_ASYNC, "async", remote_hosts=["lab1", "lab2", "lab3"])
    sampled(policy, LAB_ASYNC, 1.0)
    sampled(policy, LAB_ASYNC[:3], 3.5)  # lab3 (worker:1 alone) silent
    assert policy.feed(lc.Tick(), 3.5) == [lc.ProbeHost("lab3")]
    (notice,) = policy.feed(lc.HostProbed("lab3", "no answer from 10.99.0.13 (port 4003) within 1.5 s"), 5.0)
    assert isinstance(notice, lc.HostNotice) and notice.unreachable and notice.tasks == ("worker:1",)
    assert "host lab3 does not answer" in notice.message and "not restarted" in notice.message
    assert policy.outcome is None
    assert policy.feed(lc.HostProbed("lab3", "no answer"), 8.0) == []  # said once
    (back,) = feed(policy, [events.make("device", "worker:1", cpu_percent=1.0)], now=9.0)
    assert back == lc.HostNotice("lab3", "host lab3 answers again after 8 s without a word", False)
    # the host of the chief and the ps is not one the run goes on without
    sampled(policy, LAB_ASYNC[2:], 12.0)
    assert policy.feed(lc.Tick(), 12.0) == [lc.ProbeHost("lab1")]
    (stop,) = policy.feed(lc.HostProbed("lab1", "no answer"), 12.5)
    assert isinstance(stop, lc.StopRun) and stop.outcome.failed_task == "supervisor@lab1"
    assert "chief:0, ps:0 on it cannot take part" in stop.outcome.reason


def test_a_lost_async_host_of_workers_is_started_again_not_the_whole_run() -> None:
    policy = started(LAB_ASYNC, "async", remote_hosts=["lab1", "lab2", "lab3"], restarts_allowed=1, max_relaunches=2)
    why = "ssh to lab3 failed: Timeout, server 10.99.0.13 not responding."
    (relaunch,) = policy.feed(lc.SupervisorExited("lab3", 255, why, ("worker:1",)), 1.0)
    assert relaunch == lc.RelaunchHost("lab3", ("worker:1",), why, 1)
    assert policy.generation == 0 and policy.outcome is None  # no whole-run restart
    feed(policy, [status("worker:1", "starting"), status("worker:1", "running")], now=2.0)
    assert policy.feed(lc.SupervisorExited("lab3", 255, why, ("worker:1",)), 3.0) == [
        lc.RelaunchHost("lab3", ("worker:1",), why, 2)]
    feed(policy, [status("worker:1", "starting")], now=4.0)
    (restart,) = policy.feed(lc.SupervisorExited("lab3", 255, why, ("worker:1",)), 5.0)
    assert isinstance(restart, lc.RestartRun) and "started again 2 time(s)" in restart.reason
    # the chief's host lost is the run's failure (here: its restart)
    policy = started(LAB_ASYNC, "async", remote_hosts=["lab1", "lab2", "lab3"])
    (stop,) = policy.feed(lc.SupervisorExited("lab1", 255, "the supervisor on lab1 (over ssh) ended abruptly",
                                              ("chief:0", "ps:0")), 1.0)
    assert isinstance(stop, lc.StopRun) and stop.outcome.failed_task == "supervisor@lab1"
    # a host whose connection ended after it stopped answering says the network's part first
    policy = started(LAB, remote_hosts=["lab1", "lab2"])
    sampled(policy, LAB, 1.0)
    sampled(policy, LAB[:1], 3.5)
    policy.hosts.unreachable["lab2"] = ("host lab2 does not answer: no answer", 1.0)
    (stop,) = policy.feed(lc.SupervisorExited("lab2", 255, why, ("worker:1",)), 20.0)
    assert isinstance(stop, lc.StopRun)
    assert stop.outcome.reason == f"host lab2 does not answer: no answer; then its supervisor's connection ended ({why})"


def test_a_hung_async_chief_says_which_host_did_not_answer() -> None:
    policy = started(LAB_ASYNC, "async", remote_hosts=["lab1", "lab2", "lab3"], progress_timeout_s=10.0)
    policy.hosts.unreachable["lab3"] = ("host lab3 does not answer", 1.0)
    (stop,) = policy.feed(lc.Tick(), 31.0)
    assert isinstance(stop, lc.StopRun) and stop.outcome.failed_task == "chief:0"
    assert "host lab3 did not answer: the chief waits for the steps it sent to the workers there" in stop.outcome.reason


# -- a restart asked for (Run.restart, a front end's restart command)


def test_a_requested_restart_restarts_the_whole_run_without_using_the_fault_budget() -> None:
    policy = started(restarts_allowed=1)
    (action,) = policy.feed(lc.RestartRequested("the user asked"), 1.0)
    assert isinstance(action, lc.RestartRun) and action.requested and action.reason == "the user asked"
    assert action.restart == 1 and policy.generation == 1
    assert policy.restarts_used == 0 and policy.requested_restarts == 1  # training.restarts is for faults
    policy.restart_started(2.0)
    assert policy.feed(lc.RestartRequested(), 2.5) == []  # restarting: nothing to restart now
    assert policy.restart_done() == []
    feed(policy, [status(t.name, "starting", generation=1) for t in DATA], now=3.0)
    # a fault now still has its one restart
    (fault,) = feed(policy, [status("worker:1", "failed", reason="boom", generation=1)], now=4.0)
    assert isinstance(fault, lc.RestartRun) and not fault.requested and fault.restart == 1
    assert policy.restarts_used == 1 and policy.generation == 2


def test_a_requested_restart_is_refused_while_starting_or_ending() -> None:
    policy = Lifecycle(DATA, mode="data")
    assert policy.feed(lc.RestartRequested(), 0.0) == []  # still starting
    policy.started()
    (stop,) = policy.feed(lc.StopRequested(), 1.0)
    assert isinstance(stop, lc.StopRun)
    assert policy.feed(lc.RestartRequested(), 1.5) == [] and policy.generation == 0


def test_feed_sample_does_what_feeding_the_events_input_does() -> None:
    """The dispatcher's hot path (a step or device event fed without its input object) changes the policy as
    ``feed(from_event(event))`` does, and says the same: a host heard again, its samples, steps, CPU figures."""
    samples = [events.make("device", "worker:0", cpu_percent=50.0), events.make("device", "worker:1", rss_bytes=5),
               events.make("device", "worker:1", cpu_percent=7), step("worker:0", 3), step("worker:1", 4, worker=1),
               step("worker:0", 5, generation=1), events.make("device", "worker:0", cpu_percent=9.0, generation=1),
               events.make("device", "nobody", cpu_percent=1.0), step("nobody", 2),
               status("worker:1", "running"), events.make("info", "worker:0", message="hi")]

    def state(policy: Lifecycle) -> Any:
        return ({n: (t.last_step, t.progress_at, list(t.cpu)) for n, t in policy.tasks.items()},
                policy.clock.run_progress_at, sorted(policy.hosts.sampled), dict(policy.hosts.heard_at))

    said: list[lc.Action] = []
    for mode, tasks, silent in (("data", LAB, "lab2"), ("async", LAB_ASYNC, "lab3")):
        hosts = ["lab1", "lab2", "lab3"]
        one, other = started(tasks, mode, remote_hosts=hosts), started(tasks, mode, remote_hosts=hosts)
        for policy in (one, other):  # hosts went silent and one does not answer: hearing from it again is news
            sampled(policy, tasks, 1.0)
            sampled(policy, tasks[:1], 3.5)
            policy.feed(lc.Tick(), 3.5)
            policy.feed(lc.HostProbed(silent, "no answer"), 4.0)
        for now, event in enumerate(samples, 5):
            decoded = events.decode(events.encode(event))
            assert decoded is not None
            item = lc.from_event(decoded)
            got = lc.feed_sample(one, decoded, float(now))
            assert got == ([] if item is None else other.feed(item, float(now)))
            assert state(one) == state(other)
            said += got
    assert any(isinstance(a, lc.HostNotice) and not a.unreachable for a in said)
