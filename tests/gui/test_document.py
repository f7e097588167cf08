"""The document's cluster rules, without widgets."""

from __future__ import annotations

from engine.contract import config as cfg
from engine.contract.config import Cluster, Host, Task
from gui import document as d


def test_renumber_gives_each_role_indices_in_canvas_order() -> None:
    cluster = Cluster(hosts=(Host("a", tasks=(Task("worker", 3), Task("ps", 5))),
                             Host("b", tasks=(Task("worker", 0), Task("chief", 2)))))
    out = d.renumber(cluster)
    assert [t.name for _, t in out.tasks()] == ["worker:0", "ps:0", "worker:1", "chief:0"]


def test_add_and_remove_keep_layout_and_validity() -> None:
    doc = d.Document.of(cfg.default_config())
    doc = d.add_host(doc)
    doc = d.add_task(doc, 1, "worker")
    assert len(doc.layout) == 2
    assert [t.name for _, t in doc.config.cluster.tasks()] == ["worker:0", "worker:1", "worker:2"]
    doc = d.remove_task(doc, 0, 0)
    assert [t.name for _, t in doc.config.cluster.tasks()] == ["worker:0", "worker:1"]
    assert cfg.validate(doc.config) == []
    doc = d.move_task(doc, 1, 0, 0)
    assert [len(h.tasks) for h in doc.config.cluster.hosts] == [2, 0]
    doc = d.remove_host(doc, 1)
    assert len(doc.layout) == 1 and len(doc.config.cluster.hosts) == 1


def test_cluster_fix_for_async_and_back() -> None:
    config = cfg.default_config()
    async_config = cfg.replace(config, parallelism=cfg.replace(config.parallelism, mode="async"))
    assert cfg.validate(async_config)
    cluster, changes = d.cluster_fix(async_config, "async")
    assert changes
    fixed = cfg.replace(async_config, cluster=cluster)
    assert cfg.validate(fixed) == []
    data = cfg.replace(fixed, parallelism=cfg.replace(fixed.parallelism, mode="data"))
    cluster, changes = d.cluster_fix(data, "data")
    assert any("ps" in c for c in changes)
    # chief + 2 workers train as 3 replicas: only the batch size is left to fix, nothing of the cluster
    assert [p.field for p in cfg.validate(cfg.replace(data, cluster=cluster))] == ["training.global_batch_size"]
    assert d.cluster_fix(cfg.default_config(), "data") == (cfg.default_config().cluster, [])
