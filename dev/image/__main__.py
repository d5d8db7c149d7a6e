"""``python -m dev.image``: see ``dev.image.build``."""

from __future__ import annotations

import sys

from dev.image.build import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
