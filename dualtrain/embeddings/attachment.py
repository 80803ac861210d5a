"""What every attachment offers whatever its framework: prefetch, flush, hold, detach, steps.

An attachment is safe to share between threads: see `dualtrain.embeddings.session`.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from dualtrain.embeddings.ids import Lookup, lookup
from dualtrain.embeddings.session import RowSession
from dualtrain.embeddings.sharding import Route, Shard
from dualtrain.embeddings.store import EmbeddingStore

__all__ = ["Attachment", "ShardedAttachment"]


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


class ShardedAttachment(Attachment):
    """The framework-neutral half of attaching a shard (a store after ``mv.sync(store)``).

    `local` is the adapter's ordinary attachment over this process's rows; it trains them
    with each row's gradient summed over the processes (see `dualtrain.embeddings.sharding`).
    ``fetch``, ``prefetch`` and ``step`` are collectives: every process calls them in the
    same order, with its own ids (any ids of the whole table; none is fine).

    Attributes:
        local: the attachment training this process's rows (local ids).
        shard: the store's `Shard`.
    """

    def __init__(self, local: Any, shard: Shard) -> None:
        self.local, self.shard = local, shard
        self.store, self.mode, self.session = local.store, local.mode, local.session
        self._route: Route | None = None  # the open batch's
        self._ahead: Future[Route] | None = None  # a prefetched batch's route
        self._router: ThreadPoolExecutor | None = None  # routes prefetches on `shard.ahead`

    def exchange_rows(self, ids: tuple[Any, ...]) -> tuple[Lookup, np.ndarray]:
        """Routes `ids` to their owners and brings their rows back (two exchanges).

        Returns:
            The batch's `Lookup` and its unique rows, [U, dim] host rows in its order.
        """
        found, refused = self._lookup(ids)
        # Held from here to the step (the local fetch keeps the hold): another thread of
        # this process waits, so its exchanges never interleave with this batch's.
        with self.session.owned():
            ahead, self._ahead = self._ahead, None
            route = None
            if ahead is not None:
                routed = ahead.result()  # a failed route raises here, on every process
                # Every process must take the same way: one routing again while another
                # uses its prefetch would pair different collectives.
                matched = found is not None and found.same_ids(routed.lookup)
                if self.shard.agree(int(matched), refused).all():
                    route = routed
            if route is None:
                route = self.shard.route(found, refused=refused)
            assert found is not None
            served = self.fetch_local(route.union)
            try:
                rows = self.shard.serve(route, served)
            except BaseException:
                self.local.release()
                raise
            self._route = route
        return found, rows

    def _lookup(self, ids: tuple[Any, ...]) -> tuple[Lookup | None, BaseException | None]:
        """The ids checked, or the error to tell the other processes before raising it."""
        try:
            return lookup(ids, self.store.num_rows), None
        except Exception as err:
            return None, err

    def require_route(self) -> Route:
        """The route of the batch this thread fetched; ArgumentError when it has none.

        Checked before any exchange: a thread without a batch must not enter a collective.
        """
        self.session.require_current()
        assert self._route is not None
        return self._route

    def step_rows(self, grad: np.ndarray) -> None:
        """Sends `grad` ([U, dim], the batch's unique rows) to the owners; steps this shard.

        Raises:
            ArgumentError: no batch fetched by this process.
        """
        route = self.require_route()
        try:
            summed = self.shard.collect(route, grad)
        except BaseException:
            self.release()
            raise
        self._route = None
        self.step_local(summed)

    def fetch_local(self, union: np.ndarray) -> np.ndarray:
        """Fetches this shard's rows `union` (local ids) from `local`; host rows [M, dim].

        The adapter's: it keeps what it needs to step them (`step_local`).
        """
        raise NotImplementedError

    def step_local(self, summed: np.ndarray) -> None:
        """Steps the local rows fetched last with their summed gradient [M, dim] (adapter)."""
        raise NotImplementedError

    def prefetch(self, *ids: Any) -> None:
        """Routes the next batch's `ids` ahead of its fetch (a collective).

        Where the exchange has a channel of its own for it (``exchange.ahead``: torch's
        second gloo group), the ids travel on a background thread while this one computes;
        else (JAX, whose collectives are ordered by the one thread that issues them) they
        travel now and this shard's rows of the batch are gathered in the background. The
        rows themselves travel at the fetch: the step in between changes some of them.
        """
        found, refused = self._lookup(ids)
        with self.session.owned():  # one thread's exchanges at a time, as for fetch
            if self._ahead is not None:
                self._ahead.result()  # one prefetch at a time, in order on every process
            channel = getattr(self.shard.exchange, "ahead", None)
            if channel is None:
                route = self.shard.route(found, refused=refused)  # raises on all if refused
                self.prefetch_local(route.union)
                self._ahead = Future()
                self._ahead.set_result(route)
                return
            if self._router is None:
                self._router = ThreadPoolExecutor(1, thread_name_prefix="dualtrain-route")
            self._ahead = self._router.submit(self.shard.route, found, channel, refused)
            if refused is not None:  # the others learn of it on the channel; then raise here
                self._ahead.exception()  # kept: the next fetch raises it, as the others' do
                raise refused

    def prefetch_local(self, union: np.ndarray) -> None:
        """Starts gathering this shard's rows `union` for the next `fetch_local` of them."""
        self.local.prefetch(union)

    def detach(self) -> None:
        """Flushes and frees the store for another attachment (its tables stay)."""
        if self._router is not None:
            self._router.shutdown(wait=True)
            self._router = None
        super().detach()

    def release(self) -> None:
        """Gives up this thread's fetched batch unstepped (every process must: a collective).

        A thread without an open batch changes nothing.
        """
        if self.session.holds():
            self._route = None
            self.local.release()

    def settle(self) -> None:
        """Exact mode: brings this process's rows up to the current step (not a collective)."""
        self.local.settle()
