"""``python -m paracheck.cli``: the same as ``paracheck``."""

import sys

from paracheck.cli import main

sys.exit(main())
