"""The document's cluster rules, without widgets."""

from __future__ import annotations

from engine.contract import config as config_mod
from engine.contract.config import Cluster, Host, Task
from gui import document as d


def test_renumber_gives_each_role_indices_in_canvas_order() -> None:
    cluster = Cluster(hosts=(Host("a", tasks=(Task("worker", 3), Task("ps", 5))),
                             Host("b", tasks=(Task("worker", 0), Task("chief", 2)))))
    out = d.renumber(cluster)
    assert [t.name for _, t in out.tasks()] == ["worker:0", "ps:0", "worker:1", "chief:0"]


def test_add_and_remove_keep_layout_and_validity() -> None:
    doc = d.Document.of(config_mod.default_config())
    doc = d.add_host(doc)
    doc = d.add_task(doc, 1, "worker")
    assert len(doc.layout) == 2
    assert [t.name for _, t in doc.config.cluster.tasks()] == ["worker:0", "worker:1", "worker:2"]
    doc = d.remove_task(doc, 0, 0)
    assert [t.name for _, t in doc.config.cluster.tasks()] == ["worker:0", "worker:1"]
    assert config_mod.validate(doc.config) == []
    doc = d.move_task(doc, 1, 0, 0)
    assert [len(h.tasks) for h in doc.config.cluster.hosts] == [2, 0]
    doc = d.remove_host(doc, 1)
    assert len(doc.layout) == 1 and len(doc.config.cluster.hosts) == 1


def test_cluster_fix_for_async_and_back() -> None:
    config = config_mod.default_config()
    async_config = config_mod.replace(config, parallelism=config_mod.replace(config.parallelism, mode="async"))
    assert config_mod.validate(async_config)
    cluster, changes = d.cluster_fix(async_config, "async")
    assert changes
    fixed = config_mod.replace(async_config, cluster=cluster)
    assert config_mod.validate(fixed) == []
    data = config_mod.replace(fixed, parallelism=config_mod.replace(fixed.parallelism, mode="data"))
    cluster, changes = d.cluster_fix(data, "data")
    assert any("ps" in c for c in changes)
    # chief + 2 workers train as 3 replicas: only the batch size is left to fix, nothing of the cluster
    assert [p.field for p in config_mod.validate(config_mod.replace(data, cluster=cluster))] == ["training.global_batch_size"]
    assert d.cluster_fix(config_mod.default_config(), "data") == (config_mod.default_config().cluster, [])
