"""``python -m engine.cli``: the ``clusterdeck`` command."""

import sys

from engine.cli.main import main

sys.exit(main())
