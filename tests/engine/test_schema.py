"""The presets' JSON Schema: generated from the fields' one declaration, shipped, true to the bundled presets
and refusing what the loader refuses field by field (wrong types, bounds, unknown keys)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from engine.contract import config as config_mod
from engine.contract import resources, schema
from engine.contract.config import FIELDS, ConfigError, field_spec
from tests.engine.test_adversarial import BASE, CORPUS_FILES, WRONG, _put, _yaml_value

jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "resources" / "clusterdeck-preset.schema.json"
PRESET_FILES = sorted((ROOT / "presets").glob("*.yaml"))


@pytest.fixture(scope="module")
def validator() -> Any:
    checked = json.loads(SHIPPED.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(checked)
    return jsonschema.Draft202012Validator(checked)


def refused_by_loader(raw: Any) -> bool:
    """The loader refuses ``raw`` while reading its fields (before the whole-config rules)."""
    try:
        config_mod.from_dict(raw, check=False)
    except ConfigError:
        return True
    return False


def test_the_shipped_schema_is_the_generated_one() -> None:
    assert SHIPPED.read_text(encoding="utf-8") == schema.dumps(), (
        "regenerate it: python -m engine.contract.schema > resources/clusterdeck-preset.schema.json")
    # shipped in the package clusterdeck_data (pyproject.toml's package-data), beside the icons
    assert (resources.resources_dir() / SHIPPED.name).read_text(encoding="utf-8") == schema.dumps()


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda p: p.stem)
def test_the_schema_accepts_every_bundled_preset(path: Path, validator: Any) -> None:
    raw = config_mod.parse_yaml(path.read_text(encoding="utf-8"))
    assert [e.message for e in validator.iter_errors(raw)] == []


def test_the_schema_refuses_the_corpus_presets_the_loader_refuses_field_by_field(validator: Any) -> None:
    checked = 0
    for path in CORPUS_FILES:
        try:
            raw = config_mod.parse_yaml(path.read_text(encoding="utf-8", errors="replace"))
        except Exception:  # noqa: BLE001 - malformed YAML, duplicate keys, alias bombs: no document to check
            continue
        if isinstance(raw, dict) and refused_by_loader(raw):
            assert list(validator.iter_errors(raw)), f"{path.name}: the loader refuses it, the schema accepts it"
            checked += 1
    assert checked >= 20


@pytest.mark.parametrize(("dotted", "value"), [(k, v) for k, values in WRONG.items() for v in values],
                         ids=lambda x: str(x)[:24])
def test_the_schema_refuses_each_wrong_type_and_bound_the_loader_refuses(dotted: str, value: Any,
                                                                         validator: Any) -> None:
    if value in (".inf", ".nan"):
        pytest.skip("JSON has no infinity or NaN: YAML's .inf and .nan are refused by the loader alone")
    raw = copy.deepcopy(BASE)
    _put(raw, dotted, _yaml_value(value))
    if not refused_by_loader(raw):
        pytest.skip("a whole-config rule refuses it, which no schema of one field can say")
    assert list(validator.iter_errors(raw)), f"{dotted}={value!r}"


def test_an_unknown_key_is_refused_at_every_level(validator: Any) -> None:
    for where in ("", "parallelism", "parallelism.mesh", "parallelism.partitioner", "data", "training",
                  "cluster.hosts.0", "cluster.hosts.0.tasks.0"):
        raw = copy.deepcopy(BASE)
        node: Any = raw
        for part in filter(None, where.split(".")):
            node = node[int(part)] if part.isdigit() else node[part]
        node["Not-A-Field"] = 1
        assert refused_by_loader(raw) and list(validator.iter_errors(raw)), where


def test_every_field_is_declared_with_help_and_editor_bounds() -> None:
    for path, spec in FIELDS.items():
        assert spec.help, f"{path}: no help text"
        if spec.kind == "int":
            assert spec.minimum is not None and spec.maximum is not None, f"{path}: an integer needs both bounds"
        assert field_spec(path) is spec
        if "[]" not in path:
            assert field_spec(spec.attr) is spec
    assert field_spec("parallelism.partitioner.min_shard_bytes").attr == "parallelism.min_shard_bytes"
    assert field_spec("training.steps").maximum == config_mod.MAX_STEPS
    with pytest.raises(KeyError, match="expected a declared config field"):
        field_spec("training.nope")
