"""A router process's interpreter: the start-up heap is frozen, so full collections no
longer walk it."""

import gc

from router.core.process_policy import freeze_startup_heap


def test_objects_alive_at_start_leave_the_collected_generations():
    started = [object()]  # a container made at start-up: tracked
    assert any(o is started for o in gc.get_objects())
    try:
        frozen = freeze_startup_heap()
        # what it reports is what it froze (another thread may free a frozen object
        # right after, so the permanent generation can only have shrunk since)
        assert 0 < gc.get_freeze_count() <= frozen
        assert not any(o is started for o in gc.get_objects())
        later = [object()]
        assert any(o is later for o in gc.get_objects())  # made after: collected as usual
    finally:
        gc.unfreeze()
