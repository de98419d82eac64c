"""Storage I/O: one small interface over local disk, S3 and any fsspec store, with an atomic create on
each (:mod:`.backend`), and the inotify reader that lets local-disk waiters sleep until a file changes
(:mod:`.inotify`). Knows nothing of Hudi.
"""
