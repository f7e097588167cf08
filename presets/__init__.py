"""The bundled presets, installed as ``clusterdeck_data.presets`` so that installed copies find them
through ``importlib.resources`` (see :mod:`engine.contract.resources`)."""
