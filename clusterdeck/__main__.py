"""``python -m clusterdeck``: what this is; with arguments, the ``clusterdeck`` command."""

from __future__ import annotations

import sys

from clusterdeck import main

if __name__ == "__main__":
    sys.exit(main())
