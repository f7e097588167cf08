"""ClusterDeck's public API for your own training programs (docs/programs.md).

::

    import clusterdeck

    for step in range(1, steps + 1):
        per_replica_loss = train_step(iterator)
        clusterdeck.report(step, loss=per_replica_loss, examples=global_batch)

- :func:`report`: a custom loop's step figures (loss, metrics, examples) as ClusterDeck's per-replica
  ``step`` events; a cheap no-op outside a ClusterDeck run, so the program still runs by hand.
- :class:`ClusterDeckCallback`: ``model.fit``'s per-replica figures (in a ClusterDeck program task it
  is added to every ``fit`` without a line changed; outside one it writes a run folder of its own).
- :mod:`sharded`: DTensor building blocks for users' sharded models (``engine.runtime.sharded``).

Importing this module imports neither TensorFlow nor ClusterDeck's runtime: each name loads on first
use. ``python -m clusterdeck`` says what this is, and ``python -m clusterdeck run ...`` is the
``clusterdeck`` command. These names stay as they are across refactors of the engine.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import ModuleType

    from engine.runtime import sharded
    from engine.runtime.keras_callback import ClusterDeckCallback

__all__ = ["ClusterDeckCallback", "report", "sharded"]

_PROGRAM_MODULE = "engine.runtime.program"


def report(step: int, loss: Any = None, *, metrics: dict[str, Any] | None = None, examples: Any = None,
           total: int | None = None, worker: Any = None) -> None:
    """Report training step ``step`` (counted from 1) of this task.

    ``loss``: a float, a scalar tensor, a ``ClusterCoordinator`` RemoteValue, or the per-replica value
    ``strategy.run`` returns (one ``step`` event per local replica, ids ranked as ClusterDeck's own loop
    ranks them). ``metrics``: ``{name: value}``, each value as ``loss``. ``examples``: examples this task
    processed since its previous call (all its replicas; gives examples/s). ``total``: the steps the
    program will run (the progress bar's end). ``worker``: in ``parallelism.mode: async``, the worker that
    ran the step (e.g. ``tf.distribute.coordinator.experimental_get_current_worker_index()`` returned
    from the step). Values are read (a device sync) only when a report is due, at most
    ``training.metrics_hz`` times a second. When ClusterDeck asked the task to stop, raises
    ``engine.runtime.stop.Stopped`` (the task then ends as ``stopped``).

    Outside a ClusterDeck program task this does nothing.
    """
    module = sys.modules.get(_PROGRAM_MODULE)  # loaded by the task process before the program runs
    session = module.current() if module is not None else None  # type: ignore[attr-defined]
    if session is None:
        return
    session.report(step, loss, metrics=metrics, examples=examples, total=total, worker=worker)


def __getattr__(name: str) -> Any:
    if name == "ClusterDeckCallback":
        from engine.runtime.keras_callback import ClusterDeckCallback

        return ClusterDeckCallback
    if name == "sharded":
        import importlib

        module: ModuleType = importlib.import_module("engine.runtime.sharded")
        return module
    raise AttributeError(f"module 'clusterdeck' has no attribute {name!r}; expected one of {__all__}")


def __dir__() -> list[str]:
    return sorted([*__all__, "main", "version"])


def version() -> str:
    from engine.cli.main import version as cli_version

    return cli_version()


def main(argv: list[str] | None = None) -> int:
    """``python -m clusterdeck``: what this is; with arguments, the ``clusterdeck`` command."""
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        from engine.cli.main import main as cli_main

        return cli_main(argv)
    print(f"clusterdeck {version()}: the public API for your own training programs "
          f"({', '.join(__all__)}); see docs/programs.md.\n"
          "  python -m clusterdeck COMMAND ... is the clusterdeck command (python -m clusterdeck --help)")
    return 0
