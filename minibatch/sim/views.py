"""Read-only, no-copy views of the simulator's queue and running set.

A snapshot gets a :class:`RecordView` of each instead of a copy, so a pass never
copies or re-sorts the queue; a view refuses to be read once the simulator has
moved on (its :class:`Clock` changed), so a policy cannot keep one between passes.
The same goes for the running jobs in order of their requested end, a list the
simulator keeps sorted (``ClusterSnapshot.running_by_end``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from itertools import islice
from typing import Generic, TypeVar, overload

__all__ = ["Clock", "RecordView"]

T = TypeVar("T")


class Clock:
    """The simulator's state version; a view is valid only while it is unchanged."""

    __slots__ = ("version",)

    def __init__(self) -> None:
        self.version = 0


class RecordView(Sequence[T], Generic[T]):
    """A read-only, no-copy view of the simulator's queue or running set: of a
    dict's values (``queue.values()``, kept by the simulator) or of a list.

    Iteration is the collection's own (C speed). Reading it after the simulator
    changed its state raises, so a policy cannot keep a snapshot between passes.
    """

    __slots__ = ("_items", "_clock", "_version")

    def __init__(self, items: Collection[T], clock: Clock) -> None:
        self._items = items
        self._clock = clock
        self._version = clock.version

    def _check(self) -> None:
        if self._clock.version != self._version:
            raise RuntimeError("snapshot read after the simulator moved on")

    def __iter__(self) -> Iterator[T]:
        self._check()
        return iter(self._items)

    def __len__(self) -> int:
        self._check()
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...

    def __getitem__(self, index: int | slice) -> T | Sequence[T]:
        self._check()
        values = self._items
        if isinstance(index, slice):
            return tuple(values)[index]
        size = len(self._items)
        position = index + size if index < 0 else index
        if not 0 <= position < size:
            raise IndexError("view index out of range")
        return next(islice(values, position, None))
