"""A run whose two workers wait forever: the tests interrupt or kill this process.

``python -m tests.multiverse.waiting_run FOLDER``
"""

from __future__ import annotations

import signal
import sys

import dualtrain
from tests.multiverse import universes

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whatever
    try:
        dualtrain.Multiverse(universes.waits, 2)(sys.argv[1])
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
