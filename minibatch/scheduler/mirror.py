"""The scheduler's copy of the server's queue, kept up to date by deltas.

A snapshot of a deep queue is mostly the same jobs as the last one: shipping
them all each pass cost the server ~30 ms to encode and the scheduler ~450 ms
to decode at 100,000 queued jobs, for a pass that plans a few of them. So the
server ships what entered or left the queue since the version the scheduler
holds (:class:`~minibatch.protocol.scheduling.PendingDelta`), and the scheduler
rebuilds the snapshot's ``pending`` here. The result is the same sequence of
the same views as a full shipment: the server's queue is in rank order
(:attr:`PendingView.rank`, unique since it ends with the id), so the copy is
kept in that order too. The snapshot gets a no-copy view of the copy, the
simulator's :class:`~minibatch.sim.views.RecordView` (a tuple of 100,000 views
built and freed each pass cost ~4 ms), which refuses to be read once the copy
has changed: a snapshot is planned before the next delta is applied.

A delta from a version the copy is not at (a scheduler started or a server
restarted meanwhile, a wake it never saw) is not applied: the copy is dropped
and the scheduler asks for the whole queue (:meth:`QueueMirror.apply` returns
None).
"""

from __future__ import annotations

import msgspec

from minibatch.core.snapshot import ClusterSnapshot, PendingView
from minibatch.protocol.scheduling import PendingDelta
from minibatch.sim.views import Clock, RecordView

#: The version of an empty copy: no delta is based on it.
NONE = -1


def _rank(view: PendingView) -> tuple[float, int, float, int]:
    return view.rank


class QueueMirror:
    def __init__(self) -> None:
        self.version = NONE
        self._views: dict[int, PendingView] = {}
        #: Changes with every change of the copy, invalidating its views.
        self._changes = Clock()

    def apply(
        self, snap: ClusterSnapshot, delta: PendingDelta | None
    ) -> ClusterSnapshot | None:
        """``snap`` with its whole queue, or None if ``delta`` does not apply
        to this copy (which is then dropped)."""
        if delta is None:  # a server that ships the whole queue each time
            return snap
        self._changes.version += 1
        if delta.base == NONE:
            self._views = {p.id: p for p in snap.pending}
            self.version = delta.version
            return snap
        if delta.base != self.version:
            self._views, self.version = {}, NONE
            return None
        self._update(delta)
        self.version = delta.version
        pending = RecordView(self._views.values(), self._changes)
        return msgspec.structs.replace(snap, pending=pending)

    def _update(self, delta: PendingDelta) -> None:
        views = self._views
        for jid in delta.removed:
            views.pop(jid, None)
        for view in delta.added:
            views.pop(view.id, None)
        if not delta.added:
            return
        added = sorted(delta.added, key=_rank)
        last = views[next(reversed(views))].rank if views else None
        for view in added:
            views[view.id] = view
        if last is not None and added[0].rank < last:
            # Released, altered or of a higher priority: it goes in the middle.
            self._views = {p.id: p for p in sorted(views.values(), key=_rank)}
