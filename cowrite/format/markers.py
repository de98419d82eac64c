"""Markers: the base files an instant is creating, for writers that cannot list them in their plan.

A writer that plans before it writes (the local engine; ``SparkWriter``'s upserts, deletes and
insert_overwrites) names every base file in its ``.inflight`` plan, and a failed write is cleaned up from
that plan. A writer that learns its file names only while writing — the Spark data source and
``SparkWriter``'s inserts and bulk_inserts, whose tasks write their rows as they see them and whose
driver plans nothing — creates a marker before each base file instead, in Hudi's direct-marker layout::

    .hoodie/.temp/<instant>/<partition path>/<base file name>.marker.CREATE

Whoever cleans up a failed instant (the writer's own abort, the lazy rollback) deletes the base files the
markers name as well as the planned ones; markers go once their instant completed or was rolled back.
Readers ignore everything under ``.hoodie/``. A marker is created before its file, so a crash can leave a
marker without a file (harmless: deleting a missing file is no error), never a file without a marker.
"""

from __future__ import annotations

from cowrite.format.fs_view import BASE_FILE_EXTENSION
from cowrite.storage.backend import Storage

MARKER_DIR = ".hoodie/.temp"
MARKER_SUFFIX = ".marker.CREATE"


def marker_path(instant: str, file_path: str) -> str:
    """The marker of ``file_path`` (relative to the table) written by ``instant``."""
    return f"{MARKER_DIR}/{instant}/{file_path}{MARKER_SUFFIX}"


def create_marker(storage: Storage, instant: str, file_path: str) -> None:
    storage.write(marker_path(instant, file_path), b"")


def marked_files(storage: Storage, instant: str, made_since: float | None = None) -> list[str]:
    """Base files (relative paths) that ``instant``'s markers name, sorted; with ``made_since`` (a
    modification time), only those of markers made since.

    Only names of base files of ``instant`` itself count (``..._<instant>.parquet``): a stray or forged
    marker must never make a cleanup delete data of another commit.
    """
    prefix = f"{MARKER_DIR}/{instant}/"
    own_suffix = f"_{instant}{BASE_FILE_EXTENSION}"
    named = (
        info.path[len(prefix) : -len(MARKER_SUFFIX)]
        for info in storage.walk_files(f"{MARKER_DIR}/{instant}")
        if info.path.startswith(prefix)
        and info.path.endswith(MARKER_SUFFIX)
        and (made_since is None or info.modified >= made_since)
    )
    return sorted(path for path in named if path.endswith(own_suffix))


def delete_markers(storage: Storage, instant: str) -> None:
    """Delete ``instant``'s markers (not the files they name): on an object store a listing and one request
    a thousand markers."""
    storage.delete_all([info.path for info in storage.walk_files(f"{MARKER_DIR}/{instant}")])
