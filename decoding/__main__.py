"""``python -m decoding``: see :mod:`decoding.cli`."""

import sys

from .cli import main

if __name__ == "__main__":  # importing it (the doctest collection does) runs nothing
    sys.exit(main())
