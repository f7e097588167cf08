"""The cluster canvas's right-click menu: for a task chip (role, move to host, delete), a host (add
tasks, GPUs, make a Slurm group or a machine, delete) or the empty canvas (add a host or a Slurm group
there). Every action calls the document model at the next event-loop turn."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from PySide6.QtCore import QPointF
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu, QWidget

from engine.contract.config import ROLES
from gui.canvas_items import ChipItem, HostItem, defer
from gui.document_model import DocumentModel


def context_menu(parent: QWidget, c: DocumentModel, item: HostItem | ChipItem | None,
                 scene_pos: QPointF | None = None) -> QMenu:
    """The right-click menu for a chip, a host or the empty canvas (``scene_pos``: where it was asked)."""
    menu = QMenu(parent)
    menu.setToolTipsVisible(True)

    def add(text: str, slot: Callable[[], object], tip: str, enabled: bool = True) -> QAction:
        action = menu.addAction(text)
        action.setToolTip(tip)
        action.setEnabled(enabled)
        action.triggered.connect(lambda _=False: defer(slot))
        return action

    if isinstance(item, ChipItem):
        i, j = item.host_index, item.task_index
        roles = menu.addMenu("Role")
        roles.setToolTip("Change this task's role")
        for role in ROLES:
            a = roles.addAction(role)
            a.setCheckable(True)
            a.setChecked(role == item.task.role)
            a.triggered.connect(lambda _=False, r=role: defer(lambda: c.update_task(i, j, role=r)))
        hosts = c.config.cluster.hosts
        if len(hosts) > 1:
            move = menu.addMenu("Move to host")
            for k, h in enumerate(hosts):
                if k != i:
                    a = move.addAction(h.name)
                    a.triggered.connect(lambda _=False, k=k: defer(lambda: c.move_task(i, j, k)))
        menu.addSeparator()
        add("Delete task", lambda: c.remove_task(i, j), "Remove this task from its host")
    elif isinstance(item, HostItem):
        i = item.host_index
        for role in ROLES:
            add(f"Add {role} task", partial(c.add_task, i, role), f"Place a new {role} task on this host")
        menu.addSeparator()
        slurm = item.host.slurm if item.host.is_slurm else None
        if slurm is not None:
            per = slurm.gpus_per_node
            add("Add GPU per node", lambda: c.update_slurm(i, gpus_per_node=per + 1),
                "Ask Slurm for one more GPU on each node (--gres=gpu:N)")
            add("Remove GPU per node", lambda: c.update_slurm(i, gpus_per_node=per - 1),
                "Ask Slurm for one GPU fewer on each node", enabled=per > 0)
            add("Make a machine", lambda: c.set_host_kind(i, "machine"),
                "Turn this Slurm group into one machine (its GPUs per node become the machine's GPUs)")
        else:
            gpus = item.host.gpus
            add("Add GPU", lambda: c.update_host(i, gpus=gpus + 1), "One more GPU slot on this host")
            add("Remove GPU", lambda: c.update_host(i, gpus=gpus - 1), "One GPU slot fewer", enabled=gpus > 0)
            add("Make a Slurm group", lambda: c.set_host_kind(i, "slurm"),
                "Run these tasks on nodes Slurm allocates (partition, nodes, time limit in its properties)")
        menu.addSeparator()
        add("Delete host", lambda: c.remove_host(i), "Remove this host and its tasks")
    else:
        pos = (scene_pos.x(), scene_pos.y()) if scene_pos is not None else None
        add("Add host here", lambda: c.add_host(pos), "Add a host box at this place")
        add("Add Slurm group here", lambda: c.add_host(pos, kind="slurm"),
            "Add a group of nodes Slurm allocates (partition, nodes, GPUs per node, time limit) at this place")
    return menu
