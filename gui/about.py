"""What Help › About says: the version installed, where the documentation is, and the versions of
what the app runs on (the engine's TensorFlow is named, never imported here)."""

from __future__ import annotations

import html
import sys
from pathlib import Path

from PySide6 import __version__ as pyside_version

import engine
from engine import version

#: The project's documentation online (the same address as ``[project.urls]`` in pyproject.toml).
DOCS_URL = "https://clusterdeck.invalid/docs/"


def local_docs() -> Path | None:
    """The documentation folder of a source checkout (docs/ beside the packages), when there is one."""
    docs = Path(engine.__file__).resolve().parents[1] / "docs"
    return docs if (docs / "architecture.md").is_file() else None


def about_html() -> str:
    """The About box's text, with links to the documentation."""
    docs = local_docs()
    links = [f"<a href='{DOCS_URL}'>Documentation</a>"]
    if docs is not None:
        links.append(f"<a href='{docs.as_uri()}'>the docs in this checkout</a> ({html.escape(str(docs))})")
    return (f"<b>ClusterDeck {html.escape(version())}</b><br>"
            "Draw a TensorFlow training cluster, pick a parallelism, launch it and watch every replica train "
            "live.<br><br>" + " · ".join(links) + "<br><br>"
            f"<small>Python {sys.version.split()[0]} · Qt for Python {pyside_version} · "
            "command line: <code>clusterdeck --help</code></small>")
