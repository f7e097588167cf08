"""ClusterDeck's bundled files: icons, the desktop entry (installed as the package ``clusterdeck_data``).

The presets (``presets/``) and examples (``examples/``) are its sub-packages ``clusterdeck_data.presets``
and ``clusterdeck_data.examples`` (see ``[tool.setuptools.package-dir]`` in pyproject.toml); read them
through :mod:`engine.contract.resources`, which works for every install layout.
"""
