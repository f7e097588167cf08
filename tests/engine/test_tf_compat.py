"""Every hook of engine.runtime.tf_compat against the installed TensorFlow/Keras: a hook an upgrade breaks
fails here, loudly, with the hook's name.

The hooks run in one fresh subprocess (logical devices must be set before TensorFlow starts), which
prints one JSON line of findings per hook.
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


@pytest.fixture(scope="module")
def findings() -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=180)
    line = next((x for x in out.stdout.splitlines() if x.startswith("PROBE ")), None)
    assert line is not None, out.stdout[-2000:] + out.stderr[-3000:]
    return json.loads(line[len("PROBE "):])


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
