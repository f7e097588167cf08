"""The app's editors follow each config field's one declaration: their ranges are the field's bounds, their
tooltips its help; and a preset saved at any value the editors allow loads again, equal and unrefused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PySide6.QtWidgets import QDoubleSpinBox, QSpinBox

from engine.contract import config as config_mod
from engine.contract.config import FIELDS, FieldSpec, field_spec
from gui.document_model import DocumentModel
from gui.properties_panel import PropertiesPanel, spec_path
from gui.settings_panel import SettingsPanel

#: Run settings an editor sets to any value in its range (numbers with both bounds, choices, flags).
EDITABLE: dict[str, FieldSpec] = {
    s.attr: s for s in FIELDS.values()
    if "[]" not in s.path and ((s.kind in ("int", "float") and s.low is not None and s.high is not None)
                               or (s.kind == "str" and s.choices) or s.kind == "bool")
}
#: Host and Slurm fields the selection's editors set.
HOST_NUMBERS = ("gpus", "ssh_port")
SLURM_NUMBERS = ("nodes", "gpus_per_node", "cpus_per_task")


def within(spec: FieldSpec) -> st.SearchStrategy[Any]:
    """Any value the field's editor offers."""
    if spec.kind == "bool":
        return st.booleans()
    if spec.choices:
        return st.sampled_from(spec.choices)
    assert spec.low is not None and spec.high is not None
    if spec.kind == "int":
        return st.integers(int(spec.low), int(spec.high))
    low = spec.low if spec.above is None else max(spec.low, spec.above)
    return st.floats(low, spec.high, exclude_min=spec.above is not None and low == spec.above,
                     exclude_max=spec.below is not None and spec.high == spec.below, allow_nan=False)


def test_the_run_settings_editors_take_range_and_tooltip_from_the_declaration(window: Any) -> None:
    panel: SettingsPanel = window.settings_panel
    spins = {path: w for path, w in panel.widgets.items() if isinstance(w, (QSpinBox, QDoubleSpinBox))}
    assert len(spins) >= 20
    for path, spin in spins.items():
        spec = field_spec(path)
        assert (spin.minimum(), spin.maximum()) == (spec.low, spec.high), path
        assert spin.toolTip().startswith(spec.help), path
    # the drift of old: the app offered steps up to 2**31 - 1, the loader refuses above MAX_STEPS
    assert panel.steps.maximum() == panel.checkpoint_every.maximum() == config_mod.MAX_STEPS
    assert panel.min_shard_bytes.maximum() == config_mod.MAX_SHARD_BYTES  # 2**40, past a QSpinBox's int
    for path in ("data.source", "model.name", "training.optimizer", "name", "data.path", "program.args"):
        assert panel.widgets[path].toolTip().startswith(field_spec(path).help), path


def test_the_selection_editors_take_range_and_tooltip_from_the_declaration(window: Any) -> None:
    panel: PropertiesPanel = window.properties
    for key, editor in panel.editors.items():
        spec = field_spec(spec_path(key))
        assert editor.toolTip().startswith(spec.help), key
        if isinstance(editor, QSpinBox):
            auto = key == "task.port"  # one below the range shows 'auto'
            assert (editor.minimum() + auto, editor.maximum()) == (spec.low, spec.high), key


def test_a_field_s_editor_is_shown_where_the_field_applies(window: Any) -> None:
    doc: DocumentModel = window.controller.document
    panel: SettingsPanel = window.settings_panel
    for mode in config_mod.MODES:
        doc.set_value("parallelism.mode", mode)
        for path in ("parallelism.partitioner", "parallelism.collective_timeout_s", "parallelism.mesh_batch"):
            assert panel.applies(path) == field_spec(path).applies_to(doc.config)
        assert panel.partitioner.isVisibleTo(panel) == (mode == "async")
        assert panel.timeout.isVisibleTo(panel) == (mode != "async")
    doc.set_value("parallelism.partitioner.kind", "fixed")  # a YAML path sets the attribute it maps to
    assert doc.config.parallelism.partitioner == "fixed" and panel.shards.isVisibleTo(panel)


@pytest.fixture
def document(qapp: Any) -> Iterator[DocumentModel]:
    doc = DocumentModel(parent=qapp)  # owned by Qt, deleted by Qt when the test ends
    yield doc
    doc.deleteLater()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_preset_saved_at_any_value_the_editors_allow_loads_again(document: DocumentModel,
                                                                  data: st.DataObject) -> None:
    doc = document
    doc.new()  # one model for every example (made once, so no Qt object is left to the garbage collector)
    chosen = data.draw(st.lists(st.sampled_from(sorted(EDITABLE)), min_size=1, max_size=12, unique=True))
    for attr in chosen:
        doc.set_value(attr, data.draw(within(EDITABLE[attr]), label=attr))
    doc.update_host(0, **{key: data.draw(within(field_spec(f"cluster.hosts[].{key}")), label=key)
                          for key in HOST_NUMBERS})
    config = doc.config
    if data.draw(st.booleans(), label="slurm group"):
        slurm = config_mod.Slurm(**{key: data.draw(within(field_spec(f"cluster.hosts[].slurm.{key}")), label=key)
                                    for key in SLURM_NUMBERS})
        host = config_mod.replace(config.cluster.hosts[0], kind="slurm", slurm=slurm)
        config = config_mod.replace(config, cluster=config_mod.Cluster(hosts=(host,)))
    assert config_mod.field_problems(config) == []
    assert config_mod.loads(config_mod.dumps(config), check=False) == config


def test_a_list_the_loader_would_refuse_is_never_committed(window: Any, qtbot: Any) -> None:
    from tests.gui.test_settings_sections import type_into

    panel: SettingsPanel = window.settings_panel
    doc: DocumentModel = window.controller.document
    before = doc.config.model.hidden
    type_into(qtbot, panel.hidden, "2000000")  # past the declared 10**6: the app once saved it, the loader refused
    assert doc.config.model.hidden == before
    assert "model.hidden: expected a list of integers from 1 to 1000000, got [2000000]" in panel.hidden.toolTip()
    type_into(qtbot, panel.hidden, "")  # no hidden layer is allowed; no example shape is not
    assert doc.config.model.hidden == ()
    type_into(qtbot, panel.shape, "")
    assert doc.config.data.shape == (784,) and "data.shape: expected a list of integers" in panel.shape.toolTip()
