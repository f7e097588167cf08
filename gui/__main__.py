"""``python -m gui``: the desktop app (what ``clusterdeck`` and ``clusterdeck gui`` hand over to)."""

import sys

from gui.app import main

sys.exit(main())
