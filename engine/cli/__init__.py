"""The headless front end: the ``clusterdeck`` command (``engine.cli.main:main``)."""
