"""A run whose two workers wait forever: the tests interrupt or kill this process.

``python -m tests.multiverse.waiting_run FOLDER``
"""

from __future__ import annotations

import sys

import dualtrain
from tests.multiverse import universes

if __name__ == "__main__":
    try:
        dualtrain.Multiverse(universes.waits, 2)(sys.argv[1])
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
