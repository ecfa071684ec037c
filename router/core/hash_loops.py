"""C-speed loops over a prompt's block hashes.

A decision touches hundreds of hashes several times (marking, expiring, evicting); a Python
`for` loop pays the interpreter per hash, where map/compress/takewhile over builtin methods
run the loop in C. These helpers keep that trick in one place.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from itertools import compress, repeat, takewhile
from operator import eq
from typing import Any


def keys_stamped(stamps: dict[Any, Any], keys: Sequence[Hashable], stamp: Any) -> list:
    """The keys whose value in `stamps` equals `stamp` (absent keys never do), in order."""
    return list(compress(keys, map(eq, map(stamps.get, keys), repeat(stamp))))


def delete_keys(d: dict[Any, Any], keys: Iterable[Hashable]) -> None:
    """Deletes keys that are all present in `d`."""
    deque(map(d.__delitem__, keys), maxlen=0)


def num_leading_in(container: Any, keys: Iterable[Hashable]) -> int:
    """How many leading keys are `in` the container."""
    return len(list(takewhile(container.__contains__, keys)))
