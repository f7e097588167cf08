"""The JSON Schema of a preset, generated from the config fields' one declaration (:data:`config.FIELDS`).

Editors read it to complete keys, show each field's help and flag wrong types, bounds and unknown keys
while a preset is typed (docs/config-schema.md). ClusterDeck's own loader stays the judge: the schema
says what one field may hold, :func:`engine.contract.config.validate` what the fields must be together.

``python -m engine.contract.schema > resources/clusterdeck-preset.schema.json`` writes the shipped copy.
"""

from __future__ import annotations

import json
from typing import Any

from engine.contract import config
from engine.contract.fields import MAX_INTS, MAX_TEXT, FieldSpec

SCHEMA_ID = "https://clusterdeck.invalid/clusterdeck-preset.schema.json"
#: Most items of each list of sections.
_MOST = {"cluster.hosts[]": config.MAX_HOSTS, "cluster.hosts[].tasks[]": config.MAX_TASKS_PER_HOST}
#: Keys a section must hold.
_REQUIRED = {"program": ["script"]}


def _leaf(s: FieldSpec) -> dict[str, Any]:
    """The schema of one declared field."""
    out: dict[str, Any]
    if s.schema is not None:
        out = dict(s.schema)
    elif s.kind == "int":
        out = {"type": "integer" if s.default is not None else ["integer", "null"]}
        out.update({k: v for k, v in (("minimum", s.minimum), ("maximum", s.maximum)) if v is not None})
    elif s.kind == "float":
        out = {"type": "number"}
        out.update({k: v for k, v in (("minimum", s.minimum), ("exclusiveMinimum", s.above),
                                      ("exclusiveMaximum", s.below)) if v is not None})
    elif s.kind == "bool":
        out = {"type": "boolean"}
    elif s.kind == "ints":
        item = {"type": "integer", "minimum": s.minimum, "maximum": s.maximum}
        out = {"anyOf": [item, {"type": "array", "items": item, "minItems": s.min_len, "maxItems": MAX_INTS}]}
    else:  # a string
        out = {"type": "string", "maxLength": MAX_TEXT}
        if s.choices is not None:
            out["enum"] = list(s.choices)
        elif s.nonempty:
            out["pattern"] = r"\S"  # not blank
    text = s.help + (f" (applies when {s.when})" if s.when else "")
    if text:
        out["description"] = text
    if s.kind != "custom" and s.default not in (None, ()):
        out["default"] = list(s.default) if isinstance(s.default, tuple) else s.default
    return out


def _object(path: str) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
    if path in _REQUIRED:
        out["required"] = _REQUIRED[path]
    return out


def preset_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a ClusterDeck preset."""
    root = _object("")
    root["properties"]["schema"] = {"const": config.SCHEMA_VERSION,
                                    "description": "The version of the preset format this ClusterDeck reads"}
    objects: dict[str, dict[str, Any]] = {"": root}

    def node(path: str) -> dict[str, Any]:
        """The object schema at ``path`` (``cluster.hosts[]``: the items of the list ``hosts``), made on need."""
        if path in objects:
            return objects[path]
        parent, _, key = path.rpartition(".")
        made = _object(path)
        holder = node(parent)["properties"]
        if key.endswith("[]"):
            holder[key[:-2]] = {"type": "array", "items": made, "maxItems": _MOST.get(path, MAX_INTS)}
        else:
            holder[key] = made
        objects[path] = made
        return made

    for path, s in config.FIELDS.items():
        parent, _, key = path.rpartition(".")
        leaf = _leaf(s)
        if path in objects or leaf.get("type") == "object":  # a custom field that is a mapping (the mesh's axes)
            target = node(path)
            target.update({k: v for k, v in leaf.items() if k != "type"})
            continue
        node(parent)["properties"][key] = leaf
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            "title": "ClusterDeck preset", "description": "A ClusterDeck run config (a preset), as YAML",
            **root}


def dumps() -> str:
    """The schema as the shipped file holds it."""
    return json.dumps(preset_schema(), indent=2) + "\n"


if __name__ == "__main__":
    print(dumps(), end="")
