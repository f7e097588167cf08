"""The cluster canvas from the keyboard: arrows walk through hosts and tasks, Ctrl+arrows move the
selected task to the previous or next host, Delete removes (the canvas's own action), the Menu key
opens the selected item's menu. The order of items and where a move goes are plain functions."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt

from gui.document_model import Selection

#: Keys that walk forwards or backwards through the items.
NEXT_KEYS = (Qt.Key.Key_Right, Qt.Key.Key_Down)
PREVIOUS_KEYS = (Qt.Key.Key_Left, Qt.Key.Key_Up)


def item_order(task_counts: Sequence[int]) -> list[Selection]:
    """Every host followed by its tasks, in the document's order."""
    order: list[Selection] = []
    for i, n in enumerate(task_counts):
        order.append(("host", i))
        order.extend(("task", i, j) for j in range(n))
    return order


def step_selection(task_counts: Sequence[int], current: Selection, step: int) -> Selection:
    """The item ``step`` places after ``current`` (wrapping round); the first or last item when none is
    selected; None on an empty cluster."""
    order = item_order(task_counts)
    if not order:
        return None
    if current not in order:
        return order[0] if step > 0 else order[-1]
    return order[(order.index(current) + step) % len(order)]


def move_target(host_count: int, current: Selection, step: int) -> int | None:
    """The host a selected task moves to with Ctrl+arrow (the neighbour, no wrap); None when it cannot move."""
    if current is None or current[0] != "task":
        return None
    k = current[1] + step
    return k if 0 <= k < host_count else None


def key_step(key: int) -> int:
    """+1 for a forward arrow, -1 for a backward one, 0 for any other key."""
    if key in NEXT_KEYS:
        return 1
    if key in PREVIOUS_KEYS:
        return -1
    return 0
