"""Keyed random streams: one home for every seeded draw dualtrain makes.

Every draw comes from a counter-based Philox stream (``np.random.Philox``) named by what it
is for and by the words that say which one, so a draw never depends on which worker,
thread, process or framework makes it, nor on what was drawn before:

===========  ===================================  ======================================
purpose      words                                 drawn by
===========  ===================================  ======================================
``init``     the parameter's name (a str)          a Craft's initial parameters
``order``    epoch                                 a Fuel epoch's order
``fill``     epoch, rank                           the rows that pad a shard's order
``augment``  epoch, sample index, position         a sample's augmentation
``rows``     block                                 an embedding table's initial rows
===========  ===================================  ======================================

The keys are part of what users reproduce (the same seed gives the same model, order and
rows in every release): tests/test_random.py pins draws of each purpose.
"""

from __future__ import annotations

import numbers
import zlib

import numpy as np

from dualtrain.errors import bad_argument

__all__ = ["AUGMENT", "EMBED", "FILL", "ORDER", "PURPOSES", "stream"]

_MASK = (1 << 64) - 1
# The counter streams' purposes, as the upper word of the key. `fuel.streams` exported these
# numbers first; `stream` takes either spelling.
ORDER, AUGMENT, FILL, EMBED = 1, 2, 3, 4
_CODES = {"order": ORDER, "augment": AUGMENT, "fill": FILL, "rows": EMBED}
PURPOSES = ("init", *_CODES)


def stream(seed: int, purpose: str | int, *words: int | str) -> np.random.Generator:
    """The generator of (seed, purpose, words): independent of every other such tuple.

    Args:
        seed: for ``"init"`` an int in [0, 2**64); for the others any int (modulo 2**64).
        purpose: one of `PURPOSES` (or the matching code: ORDER, AUGMENT, FILL, EMBED).
        words: for ``"init"`` the parameter's name; for the others up to three
            ints in [0, 2**63) (see the module's table).

    Raises:
        ArgumentError: an unknown purpose, or words of the wrong kind or number.
    """
    if purpose == "init":
        if len(words) != 1 or not isinstance(words[0], str):
            raise bad_argument("words", words, "one parameter name (a str) for purpose 'init'")
        if not _count(seed) or seed >= 2**64:
            raise bad_argument("seed", seed, "an int in [0, 2**64) for purpose 'init'")
        seed = int(seed)
        # The 128-bit key holds the whole seed above the name's 32-bit checksum; seeds below
        # 2**32 keep the keys they always had.
        return np.random.Generator(np.random.Philox(key=seed << 32 | zlib.crc32(words[0].encode())))
    code = _CODES.get(purpose) if isinstance(purpose, str) else purpose
    if code is None or code not in _CODES.values() or isinstance(code, bool):
        raise bad_argument("purpose", purpose, f"one of {PURPOSES}")
    # Philox's counter words are uint64, but NumPy maps words in [2**63, 2**64) onto others
    # (2**63 + 5 becomes 2**63) with only a warning: two epochs would share one stream.
    if len(words) > 3 or not all(_count(w) and int(w) < 2**63 for w in words):
        raise bad_argument("words", words, "up to three ints in [0, 2**63)")
    counter = [0, *map(int, words), 0, 0, 0][:4]  # the first word is Philox's own draw counter
    return np.random.Generator(np.random.Philox(counter=counter, key=(seed & _MASK) | code << 64))


def _count(word: object) -> bool:
    """A non-negative int, NumPy's included, not a bool."""
    if isinstance(word, bool) or not isinstance(word, numbers.Integral):
        return False
    return int(word) >= 0
