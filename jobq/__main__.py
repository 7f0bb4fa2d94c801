"""``python -m jobq``: the jobq command."""

import sys

from .cli import main

sys.exit(main())
