"""Every hook of engine.runtime.tf_compat against the installed TensorFlow/Keras: a hook an upgrade breaks
fails here, loudly, with the hook's name.

The hooks run in one fresh subprocess (logical devices must be set before TensorFlow starts), which
prints one JSON line of findings per hook; ``copy_when_fetched`` runs in a second one, the chief of a real
ParameterServerStrategy cluster whose worker it kills and restarts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import ROOT

PROBE = r'''
import json, os, sys
import numpy as np
import tensorflow as tf
import keras
from engine.runtime import tf_compat

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
out = {}

def finding(name, fn):
    try:
        out[name] = fn()
    except Exception as exc:
        out[name] = {"error": f"{type(exc).__name__}: {exc}"}

def multi_worker_devices():
    tf_compat.emulate_multi_worker_devices(2)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    return {"replicas": strategy.num_replicas_in_sync, "devices": list(strategy.extended.worker_devices)}

def all_reduce_wait():
    strategy = tf.distribute.MirroredStrategy(["/device:CPU:0", "/device:CPU:1"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
    timer = tf_compat.time_gradient_all_reduce(optimizer)
    x = np.ones((8, 4), np.float32)
    y = np.zeros((8,), np.int32)
    ds = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(8))

    @tf.function
    def step(batch):
        def fn(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(yb, model(xb), from_logits=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return timer.wait()
        return strategy.run(fn, args=batch)

    before = [v.numpy().copy() for v in model.trainable_variables]
    waits = strategy.experimental_local_results(step(next(iter(ds))))
    moved = any(not np.allclose(a, v.numpy()) for a, v in zip(before, model.trainable_variables))
    return {"hooked": timer.hooked, "waits": [float(w.numpy()) for w in waits], "moved": moved}

def compute_loss():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    seen = tf.Variable(0.0)
    calls = []

    def after(loss, kwargs, args):
        calls.append(1)
        seen.assign(tf.cast(loss, tf.float32))

    tf_compat.wrap_compute_loss(model, after)
    tf_compat.wrap_compute_loss(model, after)  # a second wrap replaces the first
    x = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    y = np.arange(16) % 3
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    return {"traced": len(calls), "seen": float(seen.numpy()), "logged": float(history.history["loss"][0])}

def worker_index():
    fn = getattr(tf.distribute.coordinator, "experimental_get_current_worker_index", None)
    return {"exists": callable(fn)}

def coordinator_timers():
    # the timers ClusterCoordinator's worker threads write, written here the same way
    from tensorflow.python.distribute.coordinator import metric_utils
    import time
    before = tf_compat.coordinator_timers()
    with metric_utils.monitored_timer("closure_execution"):
        time.sleep(0.02)
    with metric_utils.monitored_timer("remote_value_fetch"):
        time.sleep(0.01)
    return {"before": before, "after": tf_compat.coordinator_timers()}


def scheduled_concrete():
    # what ClusterCoordinator.schedule looks up for a tf.function: the first worker's slice of the
    # arguments (PerWorkerValues hold one value per worker), by type
    @tf.function
    def group(x, n):
        return tf.reduce_sum(x) * tf.cast(n, tf.float32)

    from tensorflow.python.distribute.coordinator.values import RemoteValueImpl
    spec = tf.TensorSpec([2], tf.float32)  # as a per-worker iterator's remote values carry their spec
    per_worker = tf.distribute.experimental.coordinator.PerWorkerValues(
        (RemoteValueImpl(None, spec), RemoteValueImpl(None, spec)))
    n = tf.constant(3, tf.int64)
    concrete = tf_compat.scheduled_concrete_function(group, (per_worker, n))
    again = tf_compat.scheduled_concrete_function(group, (per_worker, tf.constant(5, tf.int64)))
    return {"concrete": isinstance(concrete, tf.types.experimental.ConcreteFunction),
            "same": concrete is again, "traced": group.experimental_get_tracing_count(),
            "value": float(concrete(tf.constant([1.0, 2.0]), n).numpy())}

finding("scheduled_concrete_function", scheduled_concrete)
finding("emulate_multi_worker_devices", multi_worker_devices)
finding("time_gradient_all_reduce", all_reduce_wait)
finding("wrap_compute_loss", compute_loss)
finding("current_worker_index", worker_index)
finding("coordinator_timers", coordinator_timers)
finding("untested_versions", lambda: {"note": tf_compat.untested_versions()})
print("PROBE " + json.dumps(out))
sys.stdout.flush()
os._exit(0)
'''


def run_probe(source: str, timeout: float) -> dict[str, Any]:
    """Run a probe in a fresh Python (no TF_CONFIG, no GPU) and return the findings it prints."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    out = subprocess.run([sys.executable, "-c", source], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    line = next((x for x in out.stdout.splitlines() if x.startswith("PROBE ")), None)
    assert line is not None, out.stdout[-2000:] + out.stderr[-3000:]
    return json.loads(line[len("PROBE "):])


@pytest.fixture(scope="module")
def findings() -> dict[str, Any]:
    return run_probe(PROBE, timeout=180)


def no_error(found: dict[str, Any]) -> dict[str, Any]:
    assert "error" not in found, found["error"]
    return found


def test_multi_worker_strategy_takes_every_emulated_device(findings: dict[str, Any]) -> None:
    found = no_error(findings["emulate_multi_worker_devices"])
    assert found["replicas"] == 2
    assert [d.rsplit("/", 1)[-1] for d in found["devices"]] == ["device:CPU:0", "device:CPU:1"]


def test_all_reduce_wait_is_measured_and_the_step_still_trains(findings: dict[str, Any]) -> None:
    found = no_error(findings["time_gradient_all_reduce"])
    assert found["hooked"] is True
    assert len(found["waits"]) == 2 and all(w > 0 for w in found["waits"]), found["waits"]
    assert found["moved"], "the wrapped all-reduce must still hand the gradients to the update"


def test_compute_loss_wrap_sees_the_loss_fit_logs(findings: dict[str, Any]) -> None:
    found = no_error(findings["wrap_compute_loss"])
    assert found["traced"] >= 1
    assert found["seen"] == pytest.approx(found["logged"], rel=1e-4)


def test_worker_index_function_exists(findings: dict[str, Any]) -> None:
    assert no_error(findings["current_worker_index"])["exists"] is True


def test_coordinator_timers_read_what_the_coordinator_writes(findings: dict[str, Any]) -> None:
    found = no_error(findings["coordinator_timers"])
    assert found["before"] == {"coordinator_functions": 0, "coordinator_run_s": 0.0, "coordinator_copy_s": 0.0}
    after = found["after"]
    assert after["coordinator_functions"] == 1
    assert after["coordinator_run_s"] >= 0.02 and 0.01 <= after["coordinator_copy_s"] < after["coordinator_run_s"]


def test_the_scheduled_concrete_function_is_found_once_for_arguments_of_one_type(findings: dict[str, Any]) -> None:
    found = no_error(findings["scheduled_concrete_function"])
    assert found == {"concrete": True, "same": True, "traced": 1, "value": 9.0}


def test_tested_versions_are_the_installed_ones(findings: dict[str, Any]) -> None:
    # an upgrade makes this fail: re-run this module, then update TESTED_VERSIONS
    assert no_error(findings["untested_versions"])["note"] is None


def test_a_changed_internal_fails_loudly_with_the_hook_named() -> None:
    pytest.importorskip("tensorflow")
    from engine.runtime import tf_compat

    class Changed:
        def _initialize_local_devices(self, cluster_resolver: Any) -> None: ...

    with pytest.raises(tf_compat.CompatError, match=r"tf_compat\.hook: .*_initialize_local_devices takes "
                                                    r"\(self, cluster_resolver\).*expected \(self, "
                                                    r"cluster_resolver, worker_device\)"):
        tf_compat._require("hook", Changed, "_initialize_local_devices",
                           ("self", "cluster_resolver", "worker_device"))
    with pytest.raises(tf_compat.CompatError, match="is gone"):
        tf_compat._require("hook", Changed, "_missing", ("self",))


#: A real ParameterServerStrategy cluster: this probe is the chief, a worker and a ps are server processes.
#: What copy_when_fetched must do, each case against a worker process: the result is copied when the
#: chief fetches it, not by the coordinator's worker thread; a worker killed, or restarted, after the
#: function ended loses the result (ResultLost), never its update; the function's own failure is raised
#: as it is. What wait_for must do: wait without copying, and raise the function's own failure.
COPY_PROBE = r'''
import json, os, signal, socket, subprocess, sys, time
os.environ["GRPC_FAIL_FAST"] = "use_caller"  # as the async tasks run

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

cluster = {job: [f"127.0.0.1:{free_port()}"] for job in ("chief", "worker", "ps")}
SERVER = ("import json, sys, tensorflow as tf\n"
          "tf.distribute.Server(tf.train.ClusterSpec(json.loads(sys.argv[1])), job_name=sys.argv[2], "
          "task_index=0, protocol='grpc', start=True).join()\n")

def start(job):
    return subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(cluster), job], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)

def serving(job, timeout=60):
    host, port = cluster[job][0].split(":")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{job} never served")

def kill(job):
    procs[job].send_signal(signal.SIGKILL)
    procs[job].wait()

procs = {"worker": start("worker"), "ps": start("ps")}
out = {}
try:
    import tensorflow as tf
    from engine.runtime import tf_compat
    serving("worker"); serving("ps")
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        v = tf.Variable(0.0)

    @tf.function
    def bump(n):
        v.assign_add(n)
        return n * 2.0

    @tf.function
    def bad():
        tf.debugging.assert_equal(v, -1.0, message="the function's own failure")
        return tf.constant(1.0)

    def fetch(remote):
        try:
            return float(remote.fetch())
        except tf_compat.ResultLost as exc:
            return f"ResultLost: {exc}"
        except tf.errors.OpError as exc:
            return type(exc).__name__

    # held and fetched by this thread: the coordinator's worker thread copied nothing; a plain one it copied
    held = tf_compat.copy_when_fetched(coordinator.schedule(bump, args=(tf.constant(3.0),)))
    plain = coordinator.schedule(bump, args=(tf.constant(1.0),))
    coordinator.join()
    out["copied_by_the_worker_thread"] = [held._fetched_tensors is not None, plain._fetched_tensors is not None]
    out["fetched"] = [fetch(held), fetch(plain)]
    # waited for with wait_for: copied neither by the coordinator's worker thread nor by this one
    waited = tf_compat.copy_when_fetched(coordinator.schedule(bump, args=(tf.constant(0.5),)))
    tf_compat.wait_for(waited)
    out["waited_copied"] = waited._fetched_tensors is not None
    # the worker killed after the function ended, before the fetch
    held = tf_compat.copy_when_fetched(coordinator.schedule(bump, args=(tf.constant(5.0),)))
    waited = tf_compat.copy_when_fetched(coordinator.schedule(bump, args=(tf.constant(0.25),)))
    coordinator.join()
    kill("worker")
    out["killed"] = fetch(held)
    tf_compat.wait_for(waited)  # it ended before its worker died: nothing lost, nothing raised
    out["variable_after_killed"] = float(v.numpy())
    # the worker restarted at its address after the function ended, before the fetch
    procs["worker"] = start("worker")
    serving("worker")
    held = tf_compat.copy_when_fetched(coordinator.schedule(bump, args=(tf.constant(7.0),)))
    coordinator.join()
    kill("worker")
    procs["worker"] = start("worker")
    serving("worker")
    out["restarted"] = fetch(held)
    out["variable_after_restarted"] = float(v.numpy())
    # the function's own failure (last: the coordinator raises it again at its next call)
    out["own_failure"] = fetch(tf_compat.copy_when_fetched(coordinator.schedule(bad)))
    try:
        coordinator.join()  # raises that failure once more, and clears it
    except tf.errors.OpError:
        pass
    try:
        tf_compat.wait_for(tf_compat.copy_when_fetched(coordinator.schedule(bad)))
        out["own_failure_waited"] = None
    except tf.errors.OpError as exc:
        out["own_failure_waited"] = type(exc).__name__
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"[:1000]
finally:
    for p in procs.values():
        p.kill()
print("PROBE " + json.dumps(out), flush=True)
os._exit(0)
'''


def test_a_result_copied_when_fetched_is_lost_with_its_worker_and_never_its_update() -> None:
    found = no_error(run_probe(COPY_PROBE, timeout=240))
    assert found["copied_by_the_worker_thread"] == [False, True]
    assert found["fetched"] == [6.0, 2.0]
    # the result is lost with its worker, killed (gRPC: unavailable) or restarted (its handles gone: aborted)
    assert str(found["killed"]).startswith("ResultLost"), found
    assert str(found["restarted"]).startswith("ResultLost"), found
    # and never the function's update: 3 + 1 + 0.5 + 5 + 0.25, then + 7
    assert found["variable_after_killed"] == 9.75
    assert found["variable_after_restarted"] == 16.75
    assert found["own_failure"] == "InvalidArgumentError"
    # a function waited for is never copied, and raises its own failure as a fetch does
    assert found["waited_copied"] is False
    assert found["own_failure_waited"] == "InvalidArgumentError"


def test_copy_when_fetched_refuses_what_is_not_a_coordinators_remote_value() -> None:
    pytest.importorskip("tensorflow")
    from engine.runtime import tf_compat

    with pytest.raises(tf_compat.CompatError, match=r"tf_compat\.copy_when_fetched: .*returned a object, not a "
                                                    r"RemoteValueImpl"):
        tf_compat.copy_when_fetched(object())
