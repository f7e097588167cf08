"""Every hook into private TensorFlow/Keras internals, in one place, each behind a version guard.

ClusterDeck's runtime relies on a few internals that no public API offers:

- :func:`emulate_multi_worker_devices`: ``MultiWorkerMirroredStrategy`` takes one CPU device per
  worker when there is no GPU; emulated GPUs (logical CPU devices) need it to take them all
  (TF's private ``CollectiveAllReduceExtended._initialize_local_devices``).
- :func:`time_gradient_all_reduce`: the seconds each replica waits in the gradient all-reduce
  (Keras 3's private ``Optimizer._all_reduce_sum_gradients``), which tells stragglers apart.
- :func:`wrap_compute_loss`: each replica's own loss inside ``model.fit`` (Keras 3's private
  ``Model._compute_loss``), for :mod:`engine.runtime.keras_callback`.
- :func:`current_worker_index`: which worker runs a ``ParameterServerStrategy`` step or dataset
  (``tf.distribute.coordinator.experimental_get_current_worker_index``, experimental).
- :func:`coordinator_timers`: how long ``ClusterCoordinator``'s worker threads ran functions and copied
  their held results to the chief (TF's private ``coordinator.metric_utils`` timers).
- :func:`copy_when_fetched`: a scheduled function's result copied to the chief by the thread that
  fetches it, not by the coordinator's worker thread as the function ends (TF's private
  ``coordinator.values.RemoteValueImpl``); :func:`wait_for` waits for such a function without copying
  its result at all.
- :func:`scheduled_concrete_function`: the concrete function ``ClusterCoordinator.schedule`` looks up for a
  ``tf.function`` at every call, looked up once (TF's private ``cluster_coordinator._select_worker_slice``
  and ``_maybe_as_type_spec``, which ``schedule`` itself uses to find it).
- :func:`keep_trace_events_in_place`: ``tf.profiler.experimental.stop()`` made safe on a multi-worker task
  (TensorFlow 2.21's ``TraceMeRecorder::Consume`` copies the per-thread event deques its tracker still points
  into when its vector grows; the library's PLT slot for that copy is pointed at a relocation that moves them).

Not a patch but a TF behaviour worked around elsewhere: the coordination service's preemption
notifier installs its own C++ ``SIGTERM`` handler (it swallows the signal); :mod:`engine.runtime.stop`
blocks ``SIGTERM`` before TensorFlow starts any thread and waits for it on its own thread.

Each hook checks that what it hooks still exists with the expected signature and raises
:class:`CompatError` naming the hook, the internal and the versions otherwise, so an upgrade
breaks loudly (``tests/engine/test_tf_compat.py`` runs every hook against the installed versions).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf

#: The versions every hook here was written and tested against (major.minor).
TESTED_VERSIONS = {"tensorflow": "2.21", "keras": "3.15"}


class CompatError(RuntimeError):
    """An internal a hook relies on is gone or changed in the installed TensorFlow/Keras."""


def versions() -> dict[str, str]:
    return {"tensorflow": tf.__version__, "keras": keras.__version__}


def untested_versions() -> str | None:
    """A note when the installed TensorFlow or Keras differs (major.minor) from :data:`TESTED_VERSIONS`."""
    found = versions()
    odd = [f"{name} {found[name]}" for name, tested in TESTED_VERSIONS.items()
           if ".".join(found[name].split(".")[:2]) != tested]
    if not odd:
        return None
    tested = ", ".join(f"{k} {v}" for k, v in TESTED_VERSIONS.items())
    return f"untested versions: {', '.join(odd)} (the runtime's hooks were tested with {tested})"


def _require(hook: str, owner: Any, attr: str, params: Sequence[str]) -> Callable[..., Any]:
    """``owner.attr``, checked to be a callable taking exactly ``params`` (``self`` included)."""
    where = f"{getattr(owner, '__module__', '')}.{getattr(owner, '__qualname__', type(owner).__name__)}.{attr}"
    target = getattr(owner, attr, None)
    if target is None or not callable(target):
        raise CompatError(f"tf_compat.{hook}: {where} is gone in {_versions_text()}; "
                          f"expected it as in {_tested_text()}")
    try:
        found = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        found = None
    if found is not None and found != list(params):
        raise CompatError(f"tf_compat.{hook}: {where} takes ({', '.join(found)}) in {_versions_text()}; "
                          f"expected ({', '.join(params)}) as in {_tested_text()}")
    return target


def _versions_text() -> str:
    v = versions()
    return f"TensorFlow {v['tensorflow']} / Keras {v['keras']}"


def _tested_text() -> str:
    return f"TensorFlow {TESTED_VERSIONS['tensorflow']} / Keras {TESTED_VERSIONS['keras']}"


# --------------------------------------------------------------------------- MultiWorkerMirrored devices


def emulate_multi_worker_devices(count: int) -> None:
    """Let ``MultiWorkerMirroredStrategy`` train on ``count`` logical CPU devices of this task.

    TF picks one CPU device per worker when no GPU exists; emulated GPUs are logical CPU devices,
    which its collectives handle fine. Call before the strategy is created; only for emulation.
    """
    from tensorflow.python.distribute import collective_all_reduce_strategy as cars

    owner = cars.CollectiveAllReduceExtended
    _require("emulate_multi_worker_devices", owner, "_initialize_local_devices",
             ("self", "cluster_resolver", "worker_device"))

    def local_devices(self: Any, cluster_resolver: Any, worker_device: str) -> tuple[tuple[str, ...], str]:
        return tuple(f"{worker_device}/device:CPU:{i}" for i in range(count)), "CPU"

    owner._initialize_local_devices = local_devices


# --------------------------------------------------------------------------- all-reduce wait


class SyncTimer:
    """Seconds each replica waited in the gradient all-reduce of the current step.

    In a synchronous step every replica lasts as long as the slowest, so the time a replica
    spends waiting in the all-reduce separates a straggler (little wait) from the others (long
    wait). :meth:`wait` is a float64 tensor inside the replica function (0 without the hook).
    ``active`` False leaves the timestamps out of the functions traced meanwhile (the step breakdown switched off).
    """

    def __init__(self) -> None:
        self.local = threading.local()
        self.hooked = False
        self.active = True

    def wait(self) -> tf.Tensor:
        value = getattr(self.local, "wait", None)
        return value if value is not None else tf.constant(0.0, tf.float64)


def time_gradient_all_reduce(optimizer: keras.optimizers.Optimizer) -> SyncTimer:
    """Wrap the optimizer's all-reduce (run in each replica's own thread) with two timestamps."""
    timer = SyncTimer()
    original = _require("time_gradient_all_reduce", optimizer, "_all_reduce_sum_gradients", ("grads_and_vars",))

    def timed(grads_and_vars: Any) -> Any:
        if not timer.active:  # traced with the breakdown off: the all-reduce as it is
            return original(grads_and_vars)
        pairs = list(grads_and_vars)
        grads = [g for g, _ in pairs if g is not None]
        with tf.control_dependencies(grads):
            before = tf.timestamp()  # this replica's gradients are all there
        # the all-reduce is not made to wait for the timestamp: a gradient computed early may start its reduction
        # while the others are computed, as without the hook (holding it back cost about 2 % of a small step)
        reduced = original(pairs)
        with tf.control_dependencies([before, *(g for g, _ in reduced if g is not None)]):
            timer.local.wait = tf.timestamp() - before
        return reduced

    optimizer._all_reduce_sum_gradients = timed
    timer.hooked = True
    return timer


# --------------------------------------------------------------------------- model.fit's loss


def wrap_compute_loss(model: keras.Model, after: Callable[[Any, dict[str, Any], tuple[Any, ...]], None]) -> None:
    """Call ``after(loss, kwargs, args)`` each time ``model.fit``'s train step computes the loss.

    Idempotent per model: a second wrap replaces the first instead of stacking.
    """
    _require("wrap_compute_loss", type(model), "_compute_loss",
             ("self", "x", "y", "y_pred", "sample_weight", "training"))
    original = getattr(model, "_clusterdeck_original_loss", None) or model._compute_loss

    def compute_loss(*args: Any, **kwargs: Any) -> Any:
        loss = original(*args, **kwargs)
        after(loss, kwargs, args)
        return loss

    # plain attributes: Keras tracks layers and variables assigned to a model, not functions
    object.__setattr__(model, "_clusterdeck_original_loss", original)
    object.__setattr__(model, "_compute_loss", compute_loss)


# --------------------------------------------------------------------------- ParameterServerStrategy


def current_worker_index() -> tf.Tensor:
    """The index of the worker running the current ``ClusterCoordinator`` function or dataset (a tensor
    known only on that worker)."""
    fn = getattr(tf.distribute.coordinator, "experimental_get_current_worker_index", None)
    if fn is None:
        raise CompatError(f"tf_compat.current_worker_index: tf.distribute.coordinator."
                          f"experimental_get_current_worker_index is gone in {_versions_text()}; "
                          f"expected it as in {_tested_text()}")
    return fn()



def coordinator_timers() -> dict[str, float]:
    """This process's ``ClusterCoordinator`` timers: ``coordinator_functions`` (functions run on workers, each
    worker's dataset creation included), ``coordinator_run_s`` (seconds the worker threads waited for them
    to run) and ``coordinator_copy_s`` (seconds they then spent copying held results to the chief, while
    that worker had nothing to run). All zero before any function ran.

    TF's own timers (``tensorflow/python/distribute/coordinator/metric_utils.py``): ``closure_execution``
    (a function's run on its worker) and ``remote_value_fetch`` (the copy of its held result that follows
    on the same worker thread, before the worker's next function is sent)."""
    try:
        from tensorflow.python.distribute.coordinator import metric_utils
    except ImportError as exc:
        raise CompatError(f"tf_compat.coordinator_timers: tensorflow.python.distribute.coordinator.metric_utils "
                          f"is gone in {_versions_text()}; expected it as in {_tested_text()}") from exc
    mapping = getattr(metric_utils, "_METRICS_MAPPING", None)
    summary = getattr(metric_utils, "get_metric_summary", None)
    if not isinstance(mapping, dict) or summary is None:
        raise CompatError(f"tf_compat.coordinator_timers: metric_utils._METRICS_MAPPING or get_metric_summary "
                          f"is gone in {_versions_text()}; expected them as in {_tested_text()}")
    if not mapping:  # filled on the coordinator's first timed call
        return {"coordinator_functions": 0, "coordinator_run_s": 0.0, "coordinator_copy_s": 0.0}
    missing = [name for name in ("closure_execution", "remote_value_fetch") if name not in mapping]
    if missing:
        raise CompatError(f"tf_compat.coordinator_timers: TensorFlow's coordinator timer(s) {missing} are gone "
                          f"in {_versions_text()}; expected them as in {_tested_text()}")
    run, copy = summary("closure_execution"), summary("remote_value_fetch")
    return {"coordinator_functions": int(run["num"]), "coordinator_run_s": float(run["sum"]),
            "coordinator_copy_s": float(copy["sum"])}


class ResultLost(RuntimeError):
    """A function ran to its end on its worker, but its result could not be copied from there to the chief
    (the worker died, or restarted and lost it, before the chief fetched it). The function's effects (its
    updates on the ps tasks) stand; only what it returned is lost."""


_COPIED_WHEN_FETCHED: type | None = None


def _copied_when_fetched_class() -> type:
    global _COPIED_WHEN_FETCHED
    if _COPIED_WHEN_FETCHED is not None:
        return _COPIED_WHEN_FETCHED
    try:
        from tensorflow.python.distribute.coordinator import values as coordinator_values
    except ImportError as exc:
        raise CompatError(f"tf_compat.copy_when_fetched: tensorflow.python.distribute.coordinator.values is gone "
                          f"in {_versions_text()}; expected it as in {_tested_text()}") from exc
    base = getattr(coordinator_values, "RemoteValueImpl", None)
    if not isinstance(base, type):
        raise CompatError(f"tf_compat.copy_when_fetched: coordinator.values.RemoteValueImpl is gone in "
                          f"{_versions_text()}; expected it as in {_tested_text()}")
    for attr in ("get", "_wait_and_maybe_error", "_copy_to_local"):
        _require("copy_when_fetched", base, attr, ("self",))

    class CopiedWhenFetched(base):  # type: ignore[misc, valid-type]
        """A ``RemoteValueImpl`` whose ``get`` copies only on the thread that scheduled its function."""

        _owner_thread: int

        def get(self) -> Any:
            if threading.get_ident() != self._owner_thread:
                return None  # the coordinator's worker thread, right after the function ran: no copy
            self._wait_and_maybe_error()  # the function's own failure, raised as it is
            try:
                return super().get()
            except tf.errors.OpError as exc:
                raise ResultLost(f"a finished function's result could not be copied from its worker: "
                                 f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}") from exc

    _COPIED_WHEN_FETCHED = CopiedWhenFetched
    return CopiedWhenFetched


def copy_when_fetched(remote: Any) -> Any:
    """Have ``remote`` (what ``ClusterCoordinator.schedule`` returned) copied to the chief when this thread
    fetches it, instead of by the coordinator's worker thread as soon as the function ends.

    The coordinator copies every held result on the thread that feeds the function's worker, after the
    function ran and before that worker's next function is sent: the worker waits for the copy (a round
    trip). Copied when fetched, the copy runs on the chief's thread while the worker runs its next function.
    What that changes: the result stays on the worker until then, so a worker that dies (or restarts) in
    between loses it, and :meth:`fetch` raises :class:`ResultLost` (the function's own failure is raised as
    before). Returns ``remote``; where its function has already ended, its result may already be copied.
    """
    cls = _copied_when_fetched_class()
    if type(remote) is not cls.__mro__[1]:
        raise CompatError(f"tf_compat.copy_when_fetched: ClusterCoordinator.schedule returned a "
                          f"{type(remote).__qualname__}, not a RemoteValueImpl, in {_versions_text()}; "
                          f"expected one as in {_tested_text()}")
    remote._owner_thread = threading.get_ident()  # type: ignore[attr-defined]  # (narrowed by the check above)
    remote.__class__ = cls
    return remote


def scheduled_concrete_function(function: Any, args: tuple[Any, ...]) -> Any:
    """The concrete function ``ClusterCoordinator.schedule(function, args=args)`` runs, for ``function`` a
    ``tf.function``: to be scheduled in its place with arguments of the same types.

    Given a ``tf.function``, ``schedule`` looks its concrete function up at every call, from the type specs of
    ``args`` as the first worker sees them (a per-worker iterator's spec is a deep structure); given the
    concrete function, it skips that lookup. TensorFlow 2.21 on 2 shared cores: 0.13 ms of the chief's CPU per
    ``schedule`` against 0.43 ms. Traces ``function`` if it was not traced for these types yet."""
    try:
        from tensorflow.python.distribute.coordinator import cluster_coordinator
    except ImportError as exc:
        raise CompatError(f"tf_compat.scheduled_concrete_function: tensorflow.python.distribute.coordinator."
                          f"cluster_coordinator is gone in {_versions_text()}; expected it as in "
                          f"{_tested_text()}") from exc
    worker_slice = _require("scheduled_concrete_function", cluster_coordinator, "_select_worker_slice",
                            ("worker_id", "structured"))
    as_type_spec = _require("scheduled_concrete_function", cluster_coordinator, "_maybe_as_type_spec", ("val",))
    concrete = function.get_concrete_function(*tf.nest.map_structure(as_type_spec, worker_slice(0, args)))
    if not isinstance(concrete, tf.types.experimental.ConcreteFunction):
        raise CompatError(f"tf_compat.scheduled_concrete_function: get_concrete_function gave a "
                          f"{type(concrete).__qualname__}, not a ConcreteFunction, in {_versions_text()}; "
                          f"expected one as in {_tested_text()}")
    return concrete


def wait_for(remote: Any) -> None:
    """Wait until the function behind ``remote`` has ended, raising its own failure as ``fetch`` does, without
    copying its result to the chief where :func:`copy_when_fetched` took ``remote`` (its result stays on its
    worker until ``remote`` is dropped); any other ``remote`` is fetched (copied) as usual."""
    if _COPIED_WHEN_FETCHED is not None and type(remote) is _COPIED_WHEN_FETCHED:
        remote._wait_and_maybe_error()  # type: ignore[attr-defined]  # (a RemoteValueImpl: checked when made)
    else:
        remote.fetch()


# --------------------------------------------------------------------------- a compiled model's parts


def compiled_loss(model: keras.Model, x: Any, y: Any, y_pred: Any, sample_weight: Any) -> Any:
    """The loss Keras' ``train_step`` computes: the compiled loss (its weights, scaled for distribution)
    plus the model's regularization losses, through a ``compute_loss`` the model may override (Keras 3's
    private ``Trainer._compute_loss``, which passes ``training`` only to overrides that take it)."""
    compute = _require("compiled_loss", model, "_compute_loss", ("x", "y", "y_pred", "sample_weight", "training"))
    return compute(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)


def unscale_loss(loss: Any) -> Any:
    """``loss`` as one replica's mean: Keras scales a compiled loss by 1 / replicas in sync
    (``keras.src.losses.loss.unscale_loss_for_distribution`` undoes it; private)."""
    try:
        from keras.src.losses.loss import unscale_loss_for_distribution
    except ImportError as exc:
        raise CompatError(f"unscale_loss: keras.src.losses.loss.unscale_loss_for_distribution is gone in "
                          f"{_versions_text()}; {_tested_text()}") from exc
    return unscale_loss_for_distribution(loss)


def build_compiled(model: keras.Model, batch: Any) -> None:
    """Build the compiled loss and metrics (and the model, if it is not) symbolically from one batch, as
    ``fit`` does before its first step (Keras 3's private ``Trainer._symbolic_build``): their variables must
    exist, inside the strategy's scope, before a distributed step updates them."""
    build = _require("build_compiled", model, "_symbolic_build", ("iterator", "data_batch"))
    build(data_batch=batch)


def compiled_metrics(model: keras.Model) -> Any:
    """The compiled metrics' container (Keras 3's private ``Trainer._compile_metrics``), or None."""
    if not hasattr(model, "_compile_metrics"):
        raise CompatError(f"compiled_metrics: keras.Model._compile_metrics is gone in {_versions_text()}; "
                          f"{_tested_text()}")
    return model._compile_metrics


def metric_names(container: Any) -> list[str]:
    """The names of the results of a compiled metrics' container (its ``result()``, evaluated once)."""
    try:
        return [str(name) for name in dict(container.result())]
    except (TypeError, ValueError, tf.errors.OpError):
        return [m.name for m in getattr(container, "metrics", [])]


def compile_setting(model: keras.Model, key: str) -> Any:
    """One argument of ``compile()`` as the user gave it (Keras 3's private ``Trainer._compile_config``;
    ``get_compile_config()`` serializes every value)."""
    config = getattr(getattr(model, "_compile_config", None), "config", None)
    if not isinstance(config, dict):
        raise CompatError(f"compile_setting: keras.Model._compile_config.config is gone in {_versions_text()}; "
                          f"{_tested_text()}")
    return config.get(key)


# --------------------------------------------------------------------------- the profiler's trace collection

#: The library that holds the profiler's ``TraceMeRecorder`` in the TensorFlow wheels this was tested with.
PROFILER_LIBRARY = "libtensorflow_framework.so.2"
#: ``std::__uninitialized_copy<false>::__uninit_copy<TraceMeRecorder::ThreadEvents const*, ThreadEvents*>``: what
#: ``std::vector<ThreadEvents>`` calls (through the library's PLT) to carry its elements over when it grows.
THREAD_EVENTS_COPY = ("_ZNSt20__uninitialized_copyILb0EE13__uninit_copyIPKN3tsl8profiler15TraceMeRecorder"
                      "12ThreadEventsEPS5_EET0_T_SA_S9_")
_CONSUME = "_ZN3tsl8profiler15TraceMeRecorder7ConsumeEv"  # exported: where the library sits in memory
#: The layout of a ``ThreadEvents`` (libstdc++, new ABI, x86-64; read off the copy's own machine code): the
#: thread's id, its name (``std::string``: pointer, length, 16-byte local buffer), then ``std::deque<Event>``.
THREAD_EVENTS_SIZE, _NAME_AT, _EVENTS_AT = 120, 8, 40
_DEQUE_SIZE = THREAD_EVENTS_SIZE - _EVENTS_AT
_R_X86_64_JUMP_SLOT = 7
#: TensorFlow versions (major.minor) whose ``TraceMeRecorder::Consume`` has the bug (see
#: :func:`keep_trace_events_in_place`); XLA's own fix (``result.reserve(recorders.size())``) is not in them.
TRACE_COLLECTION_BUG = ("2.21",)


class _TraceEventsGuard:
    """The state of :func:`keep_trace_events_in_place` in this process (one per process, kept alive)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.installed: str | None = None  # the description, once installed
        self.callback: Any = None  # the ctypes function the GOT slot points at: must outlive the process
        self.original: Any = None
        self.relocations = 0  # vectors grown through it (for tests and the done file)


_TRACE_GUARD = _TraceEventsGuard()


def relocate_thread_events(first: int, last: int, dest: int) -> int:
    """Move the ``ThreadEvents`` in ``[first, last)`` to ``dest`` as a relocation: each one's bytes are carried
    over (a ``std::deque`` holds no pointer into itself, so its events stay where they are), a name kept in its
    string's local buffer is pointed at its new buffer, and the source is left an empty name and an empty deque
    (a null map: its destructor frees nothing). Returns the end of the moved range, as the copy it replaces.

    Raises ValueError (before touching anything) on a range that is not whole ``ThreadEvents`` or an element
    that does not look like one, so the caller can fall back on TensorFlow's own copy."""
    import ctypes

    size = last - first
    if not first or not dest or size < 0 or size % THREAD_EVENTS_SIZE:
        raise ValueError(f"not a range of ThreadEvents: {first:#x}..{last:#x}")
    word = ctypes.c_uint64.from_address
    count = size // THREAD_EVENTS_SIZE
    for i in range(count):
        element = first + i * THREAD_EVENTS_SIZE
        name_p, name_len = word(element + _NAME_AT).value, word(element + _NAME_AT + 8).value
        local = element + _NAME_AT + 16
        if not name_p or (name_p == local and name_len > 15) or name_len > 1 << 20:
            raise ValueError(f"ThreadEvents at {element:#x}: its name is not a std::string")
        deque_map, map_size, start_node = (word(element + _EVENTS_AT).value, word(element + _EVENTS_AT + 8).value,
                                           word(element + _EVENTS_AT + 40).value)
        if deque_map and not deque_map <= start_node < deque_map + 8 * map_size:
            raise ValueError(f"ThreadEvents at {element:#x}: its events are not a std::deque")
    for i in range(count):
        src, dst = first + i * THREAD_EVENTS_SIZE, dest + i * THREAD_EVENTS_SIZE
        ctypes.memmove(dst, src, THREAD_EVENTS_SIZE)
        local = src + _NAME_AT + 16
        if word(src + _NAME_AT).value == local:
            word(dst + _NAME_AT).value = dst + _NAME_AT + 16
        word(src + _NAME_AT).value = local
        word(src + _NAME_AT + 8).value = 0
        ctypes.c_uint8.from_address(local).value = 0
        ctypes.memset(src + _EVENTS_AT, 0, _DEQUE_SIZE)
    return dest + size


def _mapped_library(name: str) -> tuple[str, int, list[tuple[int, int, str]]]:
    """The path of the loaded library ``name``, its load address (its mapping at file offset 0) and all its
    mappings ``(start, end, permissions)``, from ``/proc/self/maps``."""
    path, base, spans = "", 0, []
    with open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) < 6 or not parts[5].rstrip("\n").endswith("/" + name):
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5].rstrip("\n")
            spans.append((start, end, parts[1]))
            if int(parts[2], 16) == 0 and not base:
                base = start
    return path, base, spans


def _plt_slot(path: str, symbol: str, anchor: str) -> tuple[int, int, int]:
    """``(GOT offset of symbol's PLT slot, symbol's own address, anchor's address)`` in the ELF file ``path``,
    all relative to the library's load address."""
    import struct

    import numpy as np

    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            raise CompatError(f"keep_trace_events_in_place: {path} is not a 64-bit little-endian ELF file")
        shoff, = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]

        def read(index: int) -> bytes:
            f.seek(sections[index][4])
            return f.read(sections[index][5])

        names = read(shstrndx)

        def named(wanted: str) -> int:
            for i, s in enumerate(sections):
                if names[s[0]:names.index(b"\0", s[0])].decode() == wanted:
                    return i
            raise CompatError(f"keep_trace_events_in_place: {path} has no {wanted} section")

        dynsym = named(".dynsym")
        strings = read(sections[dynsym][6])
        symbols = np.frombuffer(read(dynsym), dtype=np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"),
                                                               ("shndx", "<u2"), ("value", "<u8"), ("size", "<u8")]))
        relocations = np.frombuffer(read(named(".rela.plt")), dtype=np.dtype([("offset", "<u8"), ("info", "<u8"),
                                                                               ("addend", "<i8")]))

    def index_of(name: str) -> int:
        wanted, offsets, at = name.encode() + b"\0", [], strings.find(name.encode() + b"\0")
        while at >= 0:  # where the name's bytes end a string (a string table may share a tail between names)
            offsets.append(at)
            at = strings.find(wanted, at + 1)
        found = np.flatnonzero(np.isin(symbols["name"], offsets))
        if not len(found):
            raise CompatError(f"keep_trace_events_in_place: {path} exports no {name}")
        return int(found[0])

    copy, consume = index_of(symbol), index_of(anchor)
    slot = np.flatnonzero((relocations["info"] >> np.uint64(32) == copy)
                          & (relocations["info"] & np.uint64(0xFFFFFFFF) == _R_X86_64_JUMP_SLOT))
    if len(slot) != 1:
        raise CompatError(f"keep_trace_events_in_place: {path} calls {symbol} through {len(slot)} PLT slots; "
                          "expected one")
    return (int(relocations["offset"][slot[0]]), int(symbols["value"][copy]), int(symbols["value"][consume]))


def keep_trace_events_in_place() -> str:
    """Make ``tf.profiler.experimental.stop()`` safe on a task whose trace holds cross-thread events.

    TensorFlow 2.21's ``tsl::profiler::TraceMeRecorder::Consume()`` (run by ``stop()``) drains each thread's
    events into a ``std::deque`` and pushes it into a ``std::vector<ThreadEvents>`` without reserving it, while
    its ``SplitEventTracker`` keeps pointers to the deques' end events whose start it has not seen yet (a start
    recorded on a thread drained later). libstdc++'s deque has no ``noexcept`` move, so each time the vector
    grows it *copies* every deque and frees the originals; the tracker then merges the starts into freed
    memory: SIGSEGV in ``SplitEventTracker::FindStartAndMerge``, or ``free(): invalid pointer``. A
    multi-worker task hits it: its collectives' ``CollectiveExecutor::CompleteParams`` starts on a
    ``tf_Compute`` thread and ends on a ``collective_ops`` thread, about 50 times a second per thread. XLA
    since reserves the vector (``result.reserve(recorders.size())``).

    The cure here does what that reserve does: the library's PLT slot for the vector's element copy points at
    :func:`relocate_thread_events`, which moves the deques without moving their events, so the tracker's
    pointers stay valid. The slot is this library's only caller of that copy (the vector's growth). Guarded:
    Linux x86-64, TensorFlow :data:`TRACE_COLLECTION_BUG`, the library, symbols, slot and current target as
    expected, else :class:`CompatError` and nothing is changed. Idempotent; returns what it did."""
    import ctypes
    import platform
    import sys

    guard = _TRACE_GUARD
    with guard.lock:
        if guard.installed is not None:
            return guard.installed
        version = ".".join(tf.__version__.split(".")[:2])
        if version not in TRACE_COLLECTION_BUG:
            raise CompatError(f"keep_trace_events_in_place: TensorFlow {tf.__version__} is not one of "
                              f"{', '.join(TRACE_COLLECTION_BUG)}, whose profiler needs it")
        if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
            raise CompatError(f"keep_trace_events_in_place: written for Linux x86-64, not {sys.platform} "
                              f"{platform.machine()}")
        path, base, spans = _mapped_library(PROFILER_LIBRARY)
        if not path or not base:
            raise CompatError(f"keep_trace_events_in_place: {PROFILER_LIBRARY} is not loaded in this process")
        got, copy_at, consume_at = _plt_slot(path, THREAD_EVENTS_COPY, _CONSUME)
        library = ctypes.CDLL(path)
        if ctypes.cast(getattr(library, _CONSUME), ctypes.c_void_p).value != base + consume_at:
            raise CompatError(f"keep_trace_events_in_place: {path} is not loaded where /proc/self/maps says")
        slot = base + got
        if not any(start <= slot < end and "w" in perms for start, end, perms in spans):
            raise CompatError(f"keep_trace_events_in_place: the PLT slot at {slot:#x} is not writable")
        word = ctypes.c_uint64.from_address(slot)
        if word.value != base + copy_at:
            raise CompatError(f"keep_trace_events_in_place: the PLT slot points at {word.value:#x}, not at the "
                              f"library's own copy ({base + copy_at:#x}): bound lazily, or patched by another")
        kind = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t)
        original = kind(base + copy_at)

        def relocate(first: int, last: int, dest: int) -> int:
            try:
                end = relocate_thread_events(first, last, dest)
            except Exception:  # noqa: BLE001 - not a ThreadEvents range after all: TensorFlow's own copy
                return int(original(first, last, dest))
            guard.relocations += 1
            return end

        guard.callback, guard.original = kind(relocate), original
        target = ctypes.cast(guard.callback, ctypes.c_void_p).value
        if not target:
            raise CompatError("keep_trace_events_in_place: ctypes made no callable address for the relocation")
        word.value = target
        guard.installed = (f"TraceMeRecorder's growing vector relocates its deques ({PROFILER_LIBRARY} PLT slot "
                           f"{got:#x})")
        return guard.installed


def trace_events_relocated() -> int:
    """How many times a growing ``vector<ThreadEvents>`` went through :func:`keep_trace_events_in_place`."""
    return _TRACE_GUARD.relocations
