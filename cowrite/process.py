"""Everything a cowrite process keeps between calls, in one list: each cache and long-lived object, its
bound, and why keeping it is sound.

Writers commit many times a second and daemons serve hundreds of tables, so a process keeps what it
would otherwise parse, list or start again: parsed instant names, completed commit metadata, kept
directory listings, the heartbeat thread. Each module that keeps something registers it here, where it
is defined (:func:`memo` for a function's results, :func:`keep` for anything else), so nothing is kept
that :func:`kept` does not show, and :func:`forget` empties all of it — for a test that changes a table
behind cowrite's back, or a process that must see storage afresh.

What makes keeping sound is stated with each entry. Most rest on one fact of the format: a completed
timeline file is never rewritten (a file damaged in place after this process read it is not noticed
until the process forgets).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
M = TypeVar("M", bound=MutableMapping[Any, Any])


@dataclass(frozen=True)
class Kept:
    """One thing a process keeps: ``name`` (the module and what), ``bound`` (in words), ``why``."""

    name: str
    bound: str
    why: str
    size: Callable[[], int]
    clear: Callable[[], None] | None  # None: not a cache (a thread, the locks threads hold)


_KEPT: dict[str, Kept] = {}


def keep(
    name: str, bound: str, why: str, *, size: Callable[[], int], clear: Callable[[], None] | None
) -> None:
    """Register something this process keeps; ``size()`` counts its entries, ``clear()`` empties it."""
    _KEPT[name] = Kept(name, bound, why, size, clear)


def keep_mapping(name: str, mapping: M, bound: str, why: str) -> M:
    """Register ``mapping`` as :func:`keep` does, counted by its length and emptied by its ``clear``."""
    keep(name, bound, why, size=lambda: len(mapping), clear=mapping.clear)
    return mapping


def memo(maxsize: int, why: str) -> Callable[[F], F]:
    """:func:`functools.lru_cache` of ``maxsize`` entries, registered under the function's name."""

    def decorate(function: F) -> F:
        cached = lru_cache(maxsize=maxsize)(function)
        keep(
            f"{function.__module__}.{function.__qualname__}",
            f"{maxsize:,} entries",
            why,
            size=lambda: cached.cache_info().currsize,
            clear=cached.cache_clear,
        )
        return cached  # type: ignore[return-value]

    return decorate


def kept() -> list[Kept]:
    """Everything this process keeps, by name."""
    return [_KEPT[name] for name in sorted(_KEPT)]


def forget() -> None:
    """Empty every cache of this process (threads and open descriptors stay: they hold no table state)."""
    for entry in _KEPT.values():
        if entry.clear is not None:
            entry.clear()


def few_malloc_arenas(arenas: int = 2) -> None:
    """Let glibc's allocator keep at most ``arenas`` arenas, for a long-running process of many threads.

    glibc gives threads that allocate at once arenas of their own (up to eight per core) and keeps what is
    freed in each for that arena's reuse, so a service whose thread pool takes turns at large allocations
    holds several times what it uses. Call it before the threads start; an operator's ``MALLOC_ARENA_MAX``
    wins, and elsewhere than glibc this does nothing.
    """
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_ARENA_MAX, arenas)


_M_ARENA_MAX = -8  # glibc's malloc.h
