"""A service's startup objects leave the collector's generations once it is built; the cycles
made before that are collected first, and later objects are collected as before."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from tba.heap import freeze_startup_objects


class Node:
    def __init__(self) -> None:
        self.peer: Node | None = None


def cycle() -> Node:
    a, b = Node(), Node()
    a.peer, b.peer = b, a
    return a


def tracked_ids() -> set[int]:
    """Ids of the objects in the collector's three generations (frozen ones are in none)."""
    return {id(o) for generation in range(3) for o in gc.get_objects(generation)}


@pytest.fixture
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_objects_alive_when_frozen_leave_the_generations(thawed):
    kept = cycle()
    freeze_startup_objects()
    assert gc.get_freeze_count() > 0
    assert id(kept) not in tracked_ids()


def test_startup_garbage_is_collected_not_frozen(thawed):
    unreachable = cycle()
    gone = weakref.ref(unreachable)
    del unreachable
    freeze_startup_objects()
    assert gone() is None


def test_objects_made_afterwards_stay_in_the_collectors_care(thawed):
    freeze_startup_objects()
    later = cycle()
    assert gc.isenabled()
    assert id(later) in tracked_ids()
