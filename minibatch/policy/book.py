"""The views a pass plans in, with advance reservations, and placement across them.

A :class:`Book` holds one :class:`~minibatch.policy.profile.Profile` per pool of
CPUs a job may use:

* the **general** view, for jobs outside any reservation: the nodes' free
  resources, less the CPUs every advance reservation holds over its window
  (``[start, end)``, from now if it has begun) and its own jobs do not use.
  Downtime reservations (no users) are taken out the same way, and nobody may
  use them;
* one view per **user reservation**, for the jobs submitted into it (``qsub -l
  advres=NAME``, by its users): on its nodes, the lesser of the node's free CPUs
  and the reservation's own CPUs less those its running jobs hold, inside its
  window; none outside, so a job inside must end by the reservation's end.

CPU counts are per view; memory and GPUs are shared, so a placement in one view
takes them from every view (:meth:`Book.place`). The snapshot gives
reservations as CPU counts per node, not CPU ids: two reservations on one node
at different times are assumed to hold the same CPUs (what the server prefers
when it places them); the server checks the real CPU ids again when it starts a
job.
"""

from __future__ import annotations

from collections.abc import Sequence

from minibatch.core.snapshot import (
    ClusterSnapshot,
    PendingView,
    ReservationView,
    RunningView,
)
from minibatch.policy.profile import Profile, Release
from minibatch.policy.search import Shape
from minibatch.policy.timeline import INF


def releases(
    snap: ClusterSnapshot,
    names: Sequence[str],
    plain: bool,
    index: dict[str, int] | None = None,
) -> list[list[Release]]:
    """What each node of ``names`` gets back from the running jobs: (end, CPUs)
    when ``plain``, else (end, CPUs, memory, GPUs); a job past its requested
    end gives back *now*. ``index``: node name -> position (made if None)."""
    # Times are floats from here on, whatever the snapshot holds (a simulator's
    # ints): the compiled core makes them so, and plain Python must agree.
    now, running = float(snap.now), snap.running
    if len(names) == 1 and plain:
        # A flat pool of CPUs (the classic simulated machine): one
        # comprehension, no per-node bookkeeping.
        only = names[0]
        return [
            [
                (e if (e := float(r.start_time + r.walltime)) > now else now, cpus)
                for r in running
                for name, cpus in r.nodes
                if name == only
            ]
        ]
    if index is None:
        index = {name: i for i, name in enumerate(names)}
    out: list[list[Release]] = [[] for _ in names]
    for r in running:
        end = float(r.start_time + r.walltime)
        if end < now:
            end = now
        mem = r.mem_kb_per_node or 0
        for name, cpus in r.nodes:
            i = index.get(name)
            if i is not None:  # a down or offline node gives nothing back
                out[i].append(
                    (end, cpus) if plain else (end, cpus, mem, r.gpus_per_node)
                )
    return out


class Book:
    """The views one pass plans in, and placement across them.

    Args:
        snap: the snapshot; its nodes fix the node order.
    """

    __slots__ = (
        "now",
        "names",
        "_index",
        "general",
        "views",
        "_snap",
        "refusals",
        "_masks",
    )

    def __init__(self, snap: ClusterSnapshot) -> None:
        now = self.now = float(snap.now)  # see releases()
        names: list[str] = []
        cpus: list[int] = []
        mem: list[int | None] = []
        gpus: list[int | None] = []
        plain = True
        for n in snap.nodes:
            names.append(n.name)
            cpus.append(n.free_cpus)
            m = n.free_mem_kb
            mem.append(m)
            if n.gpus:
                gpus.append(n.free_gpus)
                plain = False
            else:
                gpus.append(None)
            if m is not None:
                plain = False
        self.names = tuple(names)
        self._index: dict[str, int] | None = None
        self.general = Profile(now, self.names, cpus, mem, gpus, plain)
        self._snap = snap
        #: One view per user reservation not yet over, by name.
        self.views: dict[str, Profile] = {}
        #: Why a job naming a reservation may not run in it, by job id.
        self.refusals: dict[int, str] = {}
        #: Which nodes have every feature of a set, by the set.
        self._masks: dict[tuple[str, ...], list[bool]] = {}
        if snap.reservations:
            active = [r for r in snap.reservations if r.end > now]
            if active:
                self.build()
                self._reservations(active)

    @property
    def index(self) -> dict[str, int]:
        """Node name -> index (made when first asked for)."""
        if self._index is None:
            self._index = {name: i for i, name in enumerate(self.names)}
        return self._index

    def build(self) -> None:
        """Give the general view its future (once, when a pass first needs it)."""
        general = self.general
        if general.built:
            return
        general.build(releases(self._snap, self.names, general.plain, self.index))

    def _reservations(self, active: Sequence[ReservationView]) -> None:
        general, now = self.general, self.now
        inside: dict[str, list[RunningView]] = {}
        for r in self._snap.running:
            if r.advres:
                inside.setdefault(r.advres, []).append(r)
        # User views first: they start from the physical profile.
        for resv in active:
            if resv.users:
                self.views[resv.name] = self._view(resv, inside.get(resv.name, ()))
        for resv in active:
            label = f"run into reservation {resv.name!r}"
            start = None if resv.start <= now else float(resv.start)
            for name, cpus in resv.nodes:
                i = self.index.get(name)
                if i is None:
                    continue
                general.add(i, start, float(resv.end), -cpus, 0, 0, label)
                # Jobs inside it already hold some of these CPUs.
                for run in inside.get(resv.name, ()):
                    held = sum(c for n, c in run.nodes if n == name)
                    until = float(min(run.expected_end(now), resv.end))
                    if held and until > now:
                        general.add(i, None, until, held, 0, 0, label)

    def _view(self, resv: ReservationView, jobs: Sequence[RunningView]) -> Profile:
        """The profile of one user reservation: its CPUs, inside its window.

        On each of its nodes, free CPUs are the lesser of the node's (it may
        still run a job that started before the reservation was made) and the
        reservation's own CPUs less those its running jobs hold; zero outside
        the window, so a job inside must end by the reservation's end.
        """
        now, general = self.now, self.general
        count = len(self.names)
        view = Profile(now, self.names, [0] * count, [None] * count, [None] * count)
        view.build([[] for _ in self.names])
        label = f"end after reservation {resv.name!r} ends"
        for name, held in resv.nodes:
            i = self.index.get(name)
            if i is None:
                continue
            ends = [
                (r.expected_end(now), sum(c for n, c in r.nodes if n == name))
                for r in jobs
            ]
            segments = general.segments(i)
            cuts = {float(t) for t in (resv.start, resv.end) if now < t < INF}
            cuts -= {seg[0] for seg in segments[1:]}
            for t in sorted(cuts):
                k = max(j for j, seg in enumerate(segments) if seg[0] <= t)
                segments.insert(k + 1, (t, *segments[k][1:]))
            out = []
            for k, (t, c, m, g) in enumerate(segments):
                if resv.start <= t < resv.end:
                    used = sum(n for e, n in ends if k == 0 or e > t)
                    c = min(c, held - used)
                else:
                    c = 0
                out.append((t, c, m, g))
            view.set_segments(i, out)
            if resv.end < INF:
                view.labels[resv.end] = label
        return view

    def mask_for(self, job: PendingView) -> list[bool]:
        """Which nodes have every feature ``job`` needs (it has some)."""
        mask = self._masks.get(job.features)
        if mask is None:
            need = set(job.features)
            mask = [need <= set(n.features) for n in self._snap.nodes]
            self._masks[job.features] = mask
        return mask

    def view_for(self, job: PendingView) -> Profile | None:
        """The view ``job`` plans in, or None if it may not run (see refusals)."""
        name = job.advres
        if not name:
            return self.general
        view = self.views.get(name)
        resv = next((r for r in self._snap.reservations if r.name == name), None)
        if resv is None or resv.end <= self.now:
            why = f"reservation {name!r} does not exist or has ended"
        elif view is None:
            why = f"reservation {name!r} is a downtime: no job may use it"
        elif job.user not in resv.users:
            why = f"{job.user} may not use reservation {name!r}"
        else:
            return view
        self.refusals[job.id] = why
        return None

    def place(
        self,
        view: Profile,
        nodes: Sequence[int],
        shape: Shape,
        start: float | None,
        end: float,
        label: str | int = "",
    ) -> None:
        """Hold ``shape`` on ``nodes`` over ``[start, end)`` (None = now) in
        ``view``, and its memory and GPUs in every other view."""
        _, ppn, mem, gpus = shape
        for i in nodes:
            view.add(i, start, end, -ppn, -mem, -gpus, label)
        if self.views and (mem or gpus):
            for other in (self.general, *self.views.values()):
                if other is not view:
                    for i in nodes:
                        other.add(i, start, end, 0, -mem, -gpus, label)
