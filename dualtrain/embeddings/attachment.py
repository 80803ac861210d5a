"""What every attachment offers whatever its framework: prefetch, flush, hold, detach, steps.

An attachment is safe to share between threads: see `dualtrain.embeddings.session`.
"""

from __future__ import annotations

import contextlib
from typing import Any

from dualtrain.embeddings.session import RowSession
from dualtrain.embeddings.store import EmbeddingStore

__all__ = ["Attachment"]


class Attachment:
    """The framework-neutral half of ``dualtrain_torch.attach`` / ``dualtrain_jax.attach``.

    Attributes:
        store: the EmbeddingStore trained.
        mode: "lazy" or "exact".
        session: the RowSession doing the staging and bookkeeping.
    """

    store: EmbeddingStore
    mode: str
    session: RowSession

    def prefetch(self, *ids: Any) -> None:
        """Gathers the rows of the next batch's `ids` in the background."""
        self.session.prefetch(ids)

    def release(self) -> None:
        """Gives up the batch this thread fetched without stepping it (nothing is written).

        Needed only with threads: a thread's fetch holds the attachment until its step, so
        after an evaluation fetch call release() to let other threads fetch.
        """
        self.session.abandon()

    def flush(self) -> None:
        """Waits until every write-back has landed in the store.

        Reads of ``store.table``, ``store.state`` and ``store.counters`` do this themselves.
        """
        self.session.flush()

    def hold(self) -> contextlib.AbstractContextManager[None]:
        """Holds the attachment for a ``with`` block: no other thread's step runs in it.

        For a consistent copy while other threads train:
        ``with rows.hold(): table = rows.store.table.copy()``. It waits for a batch another
        thread has open (fetched, not yet stepped); this thread may fetch and step inside.
        """
        return self.session.owned()

    def detach(self) -> None:
        """Flushes and frees the store for another attachment (its tables stay)."""
        self.session.detach()

    @property
    def steps(self) -> int:
        """Steps taken."""
        return self.session.t
