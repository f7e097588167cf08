"""The README's preset reference names every field of a preset (the config-field checklist's step 5)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _leaves(node: dict[str, Any], prefix: str = "") -> set[str]:
    """Every field path of the JSON Schema of presets (list items as ``[]``)."""
    out: set[str] = set()
    for name, sub in node.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        out.add(path)
        out |= _leaves(sub, path)
        if isinstance(sub.get("items"), dict):
            out |= _leaves(sub["items"], path + "[]")
    return out


def test_every_preset_field_is_in_the_readme_reference() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("### Preset reference")
    block_start = text.index("```yaml", start)
    block = text[block_start:text.index("```", block_start + 7)]
    named = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*):", block))  # keys, in the YAML or in its comments
    schema = json.loads((ROOT / "resources" / "clusterdeck-preset.schema.json").read_text(encoding="utf-8"))
    missing = sorted(p for p in _leaves(schema) if p.rsplit(".", 1)[-1].removesuffix("[]") not in named)
    assert not missing, f"README.md's preset reference does not name: {missing}"
