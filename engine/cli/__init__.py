"""The headless front end: the ``clusterdeck`` command (``engine.cli.main``; started by ``engine.cli.__main__``)."""
