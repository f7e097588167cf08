"""Config fields declared once: a :class:`FieldSpec` in each dataclass field's metadata, walked by one
reader, one writer and one bounds check.

A field of the config model is declared as ``steps: int = spec(200, minimum=1, maximum=MAX_STEPS,
help=...)``: its YAML key, type (from the default or ``kind``), bounds, help text, when it applies and
how it is written. :func:`read_fields` parses an untrusted mapping into a dataclass's keyword arguments,
noting every problem at once in the house wording (``expected an integer from 1 to 4096, got 'x'``);
:func:`write_fields` writes it back; :func:`check_fields` checks a built dataclass against the same bounds.
A field whose YAML is special (ports of ``'auto'``, Slurm memory, shell-split options) names a custom
``parse`` (and writer); a section holding another dataclass says so with :func:`section`.

No TensorFlow, no Qt, no YAML: the config model, the app and the JSON Schema all derive from here.
"""

from __future__ import annotations

import builtins
import dataclasses
import math
import reprlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Longest string a config holds.
MAX_TEXT = 4096
#: Most items of a list of integers (``data.shape``, ``model.hidden``).
MAX_INTS = 64


@dataclass(frozen=True)
class Problem:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


@dataclass(frozen=True)
class FieldSpec:
    """One config field, declared once.

    ``kind`` is ``int``, ``float``, ``str``, ``bool``, ``ints`` (a list of integers) or ``custom`` (read
    by the parser named ``parse``). ``write`` says when :func:`write_fields` writes it: ``always``,
    ``changed`` (only when it differs from the default) or ``set`` (only when not None). ``applies`` says
    when the field is used (the app hides its editor otherwise): a function of the :class:`RunConfig` for
    run settings, of the ``Host`` for host fields; ``when`` says the same in words. ``editor_min`` and
    ``editor_max`` bound the app's editor where the field itself has no bound (never wider than the field).
    The table of :func:`walk` fills in ``path`` (YAML), ``attr`` (attributes) and ``default``.
    """

    kind: str = ""
    key: str = ""  # the YAML key inside its section; dotted where the YAML nests (``mesh.batch``)
    help: str = ""
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None  # exclusive lower bound of a number
    below: float | None = None  # exclusive upper bound of a number
    choices: tuple[str, ...] | None = None
    nonempty: bool = False
    strip: bool = False
    min_len: int = 1  # ints: fewest items
    wording: str = ""  # what a bound problem says is expected, where the generic words would mislead
    write: str = "always"
    parse: str = ""
    applies: Callable[[Any], bool] | None = None
    when: str = ""
    editor_min: float | None = None
    editor_max: float | None = None
    schema: Mapping[str, Any] | None = None  # JSON Schema of a custom field
    path: str = ""
    attr: str = ""
    default: Any = None

    def applies_to(self, context: Any) -> bool:
        """Whether the field is used in ``context`` (a RunConfig, or a Host for host fields)."""
        return self.applies is None or bool(self.applies(context))

    @property
    def low(self) -> float | None:
        """The smallest value an editor may offer."""
        bounds = [b for b in (self.minimum, self.editor_min) if b is not None]
        return max(bounds) if bounds else None

    @property
    def high(self) -> float | None:
        """The largest value an editor may offer."""
        bounds = [b for b in (self.maximum, self.editor_max) if b is not None]
        return min(bounds) if bounds else None

    def expected(self) -> str:
        """What a value of this field must be, in the house wording."""
        if self.wording:
            return self.wording
        if self.kind == "int":
            return _int_range(self.minimum, self.maximum)
        if self.kind == "float":
            if self.above is not None:
                return f"a number > {_num(self.above)}"
            if self.minimum is not None:
                return f"a number >= {_num(self.minimum)}"
            return "a finite number"
        if self.kind == "ints":
            least = f"at least {self.min_len} " if self.min_len > 1 else ""
            return f"a list of {least}integers from {_num(self.minimum or 1)} to {_num(self.maximum or 10**6)}"
        if self.kind == "bool":
            return "true or false"
        if self.choices:
            return f"one of {_choices(self.choices)}"
        return "a string"


def spec(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
         **declared: Any) -> Any:
    """A dataclass field declared with its :class:`FieldSpec` (``kind`` follows the default's type)."""
    if "kind" not in declared:
        sample = default_factory() if default_factory is not dataclasses.MISSING else default
        declared["kind"] = ("bool" if isinstance(sample, bool) else "int" if isinstance(sample, int)
                            else "float" if isinstance(sample, float) else "str" if isinstance(sample, str)
                            else "ints" if isinstance(sample, tuple) else "custom")
    if declared["kind"] == "ints":
        declared.setdefault("minimum", 1)
        declared.setdefault("maximum", 10**6)
    meta = {"spec": FieldSpec(**declared)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def section(cls: type, key: str, *, many: bool = False, default: Any = dataclasses.MISSING,
            default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field holding another declared dataclass (``many``: a list of them) under ``key``."""
    meta = {"section": (key, cls, many)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def specs(cls: type) -> list[tuple[str, FieldSpec, Any]]:
    """(attribute, spec with its key, default) of each declared leaf field of ``cls``, in order."""
    out = []
    for f in dataclasses.fields(cls):
        s = f.metadata.get("spec")
        if s is None:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out.append((f.name, dataclasses.replace(s, key=s.key or f.name, default=default), default))
    return out


def sections(cls: type) -> list[tuple[str, str, type, bool]]:
    """(attribute, YAML key, class, many) of each section field of ``cls``."""
    return [(f.name, *f.metadata["section"]) for f in dataclasses.fields(cls) if "section" in f.metadata]


def walk(cls: type, path: str = "", attr: str = "") -> list[FieldSpec]:
    """Every leaf field under ``cls``, with its YAML ``path`` (``[]`` marks a list's items, e.g.
    ``cluster.hosts[].gpus``) and attribute path relative to its owner (``parallelism.mesh_batch``; under
    a list, relative to the item: ``slurm.nodes``)."""
    out = []
    for name, s, _ in specs(cls):
        out.append(dataclasses.replace(s, path=_join(path, s.key), attr=_join(attr, name)))
    for name, key, inner, many in sections(cls):
        out.extend(walk(inner, _join(path, key + ("[]" if many else "")), "" if many else _join(attr, name)))
    return out


def _join(a: str, b: str) -> str:
    return f"{a}.{b}" if a else b


# --------------------------------------------------------------------------- showing values


class _ShortRepr(reprlib.Repr):
    """``repr`` bounded in depth and width, so hostile input (huge ints, deep or aliased YAML) shows briefly."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxstring = 60
        self.maxother = 60

    def repr_int(self, x: int, level: int) -> str:
        try:
            return super().repr_int(x, level)
        except ValueError:  # more digits than Python converts to text
            return f"<an integer of about {int(x.bit_length() * 0.30103)} digits>"


_short_repr = _ShortRepr()


def _show(value: Any) -> str:
    try:
        text = _short_repr.repr(value)
    except Exception:  # noqa: BLE001 - a value's own __repr__ may fail; the message must not
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _is_finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _key_text(key: Any) -> str:
    return key if isinstance(key, str) else _show(key)


def _num(x: float) -> str:
    """A bound as the user writes it: ``1000000000``, ``0``, ``0.5``."""
    return builtins.str(int(x)) if _is_int(x) or (_is_finite(x) and float(x).is_integer()) else f"{x:g}"


def _int_range(minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f"an integer from {_num(minimum)} to {_num(maximum)}"
    if minimum is not None:
        return f"an integer >= {_num(minimum)}"
    if maximum is not None:
        return f"an integer <= {_num(maximum)}"
    return "an integer"


def _choices(choices: Sequence[str] | None) -> str:
    return ", ".join(repr(c) for c in (choices or ()))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def judge(s: FieldSpec, value: Any) -> str | None:
    """What is wrong with ``value`` for the field ``s`` (None: nothing), as the message after the field."""
    kind = s.kind
    if kind == "int":
        if not _is_int(value):
            return f"expected {s.expected()}, got {_show(value)}"
        if s.minimum is not None and value < s.minimum:
            return f"expected {s.wording or f'an integer >= {_num(s.minimum)}'}, got {_show(value)}"
        if s.maximum is not None and value > s.maximum:
            return f"expected {s.wording or f'an integer <= {_num(s.maximum)}'}, got {_show(value)}"
        return None
    if kind == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and _is_finite(value)
        if ok and (s.minimum is None or value >= s.minimum) and (s.above is None or value > s.above) and \
                (s.below is None or value < s.below):
            return None
        shown = f"{value:g}" if ok and s.wording else _show(value)
        return f"expected {s.expected()}, got {shown}"
    if kind == "str":
        if not isinstance(value, str):
            return f"expected {s.expected()}, got {_show(value)}"
        if s.choices is not None and value not in s.choices:
            return f"expected one of {_choices(s.choices)}, got {_show(value)}"
        if s.nonempty and not value.strip():
            return "expected a non-empty string, got ''"
        if len(value) > MAX_TEXT:
            return f"expected at most {MAX_TEXT} characters, got {len(value)}"
        return None
    if kind == "bool":
        return None if isinstance(value, bool) else f"expected true or false, got {_show(value)}"
    if kind == "ints":
        lo, hi = s.minimum if s.minimum is not None else 1, s.maximum if s.maximum is not None else 10**6
        if isinstance(value, (list, tuple)) and s.min_len <= len(value) <= MAX_INTS and \
                all(_is_int(v) and lo <= v <= hi for v in value):
            return None
        return f"expected {s.expected()}, got {_show(list(value) if isinstance(value, tuple) else value)}"
    return None


# --------------------------------------------------------------------------- reading


class _Reader:
    """Reads typed fields out of an untrusted mapping, noting problems with their path."""

    def __init__(self, data: Any, path: str, problems: list[Problem]) -> None:
        self.path = path
        self.problems = problems
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            self.fail("", f"expected a mapping of fields, got {_show(data)}")
            data = {}
        self.data: Mapping[Any, Any] = data
        self.seen: set[str] = set()
        self.children: dict[str, _Reader] = {}

    def where(self, key: str) -> str:
        if not key:
            return self.path
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, message: str) -> None:
        self.problems.append(Problem(self.where(key), message))

    def items(self, key: str, what: str, most: int, most_what: str) -> list[Any]:
        """The list under ``key`` (missing: empty), cut to its first ``most`` items; a non-list or a longer
        list is a problem naming the field."""
        value = self.raw(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(key, f"expected a list of {what}, got {_show(value)}")
            return []
        if len(value) > most:
            self.fail(key, f"expected at most {most} {most_what}, got {len(value)}")
        return value[:most]

    def raw(self, key: str) -> Any:
        self.seen.add(key)
        return self.data.get(key)

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def value(self, key: str, s: FieldSpec, default: Any) -> Any:
        """The field ``key`` read as ``s`` declares it (missing: ``default``); a problem keeps the default."""
        value = self.raw(key)
        if value is None:
            return default
        if s.kind == "ints" and _is_int(value):
            value = [value]
        message = judge(s, value)
        if message is not None:
            self.fail(key, message)
            return default
        if s.kind == "float":
            return float(value)
        if s.kind == "int":
            return int(value)
        if s.kind == "ints":
            return tuple(int(v) for v in value)
        return value.strip() if s.strip and isinstance(value, str) else value

    def int(self, key: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
        return self.value(key, FieldSpec(kind="int", minimum=minimum, maximum=maximum), default)  # type: ignore[no-any-return]

    def child(self, key: builtins.str) -> _Reader:
        self.seen.add(key)
        if key not in self.children:
            self.children[key] = _Reader(self.data.get(key), self.where(key), self.problems)
        return self.children[key]

    def finish(self, allowed: Iterable[builtins.str]) -> None:
        allowed = set(allowed) | self.seen
        for key in self.data:
            if not isinstance(key, str) or key not in allowed:
                self.fail(_key_text(key), f"unknown field (expected one of {_choices(sorted(allowed))})")


#: A custom field's reader: (the reader holding the key, the key, its spec, its default) -> the value.
CustomReader = Callable[[_Reader, str, FieldSpec, Any], Any]


def read_fields(cls: type, r: _Reader, custom: Mapping[str, CustomReader], *,
                defaults: Mapping[str, Any] | None = None, extra_keys: Iterable[str] = ()) -> dict[str, Any]:
    """The declared leaf fields of ``cls`` read from ``r`` (keyword arguments of ``cls``); then every key
    ``r`` and its nested mappings hold that no field of ``cls`` declares is a problem."""
    values: dict[str, Any] = {}
    nested: dict[str, set[str]] = {}
    for name, s, default in specs(cls):
        if defaults and name in defaults:
            default = defaults[name]
        head, _, leaf = s.key.rpartition(".")
        holder = r.child(head) if head else r
        if head:
            nested.setdefault(head, set()).add(leaf)
        values[name] = custom[s.parse](holder, leaf, s, default) if s.parse else holder.value(leaf, s, default)
    for head, keys in nested.items():
        r.child(head).finish(keys)
    top = {s.key.split(".")[0] for _, s, _ in specs(cls)} | {key for _, key, _, _ in sections(cls)}
    r.finish(top | set(extra_keys))
    return values


# --------------------------------------------------------------------------- writing and checking


#: A custom field's writer: (the value, the object holding it) -> what the YAML holds.
CustomWriter = Callable[[Any, Any], Any]


def write_fields(obj: Any, custom: Mapping[str, CustomWriter] | None = None) -> dict[str, Any]:
    """The declared leaf fields of ``obj`` as YAML values (lists for tuples), nested as the keys say;
    a field is left out as its ``write`` says."""
    out: dict[str, Any] = {}
    for name, s, default in specs(type(obj)):
        value = getattr(obj, name)
        if (s.write == "changed" and value == default) or (s.write == "set" and value is None):
            continue
        if custom and s.parse in custom:
            value = custom[s.parse](value, obj)
        elif isinstance(value, tuple):
            value = list(value)
        node = out
        *heads, leaf = s.key.split(".")
        for head in heads:
            node = node.setdefault(head, {})
        node[leaf] = value
    return out


def check_fields(obj: Any, where: str, add: Callable[[str, str], None]) -> None:
    """Check the declared numbers, lists and choices of ``obj`` (at path ``where``) against their bounds;
    custom fields and free strings are checked by the rules that know them."""
    for name, s, _ in specs(type(obj)):
        value = getattr(obj, name)
        if value is None or s.kind in ("custom", "bool") or (s.kind == "str" and s.choices is None):
            continue
        message = judge(s, value)
        if message is not None:
            add(_join(where, s.key), message)
