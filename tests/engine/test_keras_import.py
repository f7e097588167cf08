"""A task imports Keras without IPython's notebook extras (engine.runtime.keras_import)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PROBE = """
import json, sys
from engine.runtime.keras_import import import_keras
import_keras()
during = "IPython" in sys.modules
import keras.src.saving.file_editor as editor
after = {"IPython_during": during, "editor_ipython": editor.ipython is not None,
         "IPython_entry": repr(sys.modules.get("IPython", "absent"))}
import IPython  # a user's script may still import it
after["IPython_later"] = IPython.__name__
print(json.dumps(after))
"""


@pytest.mark.skipif(importlib.util.find_spec("IPython") is None, reason="IPython is not installed here")
def test_keras_comes_without_ipython_which_a_script_can_still_import() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"})
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"IPython_during": False, "editor_ipython": False, "IPython_entry": "'absent'",
                    "IPython_later": "IPython"}
