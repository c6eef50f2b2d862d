"""``python -m decoding``: see :mod:`decoding.cli`."""

import sys

from .cli import main

sys.exit(main())
