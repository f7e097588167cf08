"""Export… writes what it can: a config whose TFJob is impossible (unequal GPU counts per worker) still
gets its TF_CONFIG files and launch scripts, and the user is told why the TFJob was skipped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.contract import config as config_mod
from engine.contract.config import Cluster, Host, Task
from engine.control import export


def test_export_skips_only_the_impossible_tfjob(qtbot: Any, window: Any, dialogs: Any, tmp_path: Path) -> None:
    base = config_mod.default_config()
    hosts = (Host(name="a", address="10.0.0.1", gpus=2, tasks=(Task("worker", 0),)),
             Host(name="b", address="10.0.0.2", gpus=0, tasks=(Task("worker", 1),)))
    cfg = config_mod.replace(base, cluster=Cluster(hosts=hosts),
                             training=config_mod.replace(base.training, global_batch_size=129))
    assert not config_mod.validate(cfg)
    window.controller.new_document(cfg)
    out = tmp_path / "export"
    paths = window.export_config(out, image="registry.local/cd:1")
    assert (out / "launch-a.sh").exists() and (out / "tf_config" / "worker-1.json").exists()
    assert not (out / "tfjob.yaml").exists() and (out / export.SKIPPED_NOTE) in paths
    kind, title, text = dialogs.calls[-1]
    assert kind == "warning" and "no Kubeflow TFJob" in text and "different GPU counts" in text
    assert "TFJob skipped" in window.statusBar().currentMessage()
