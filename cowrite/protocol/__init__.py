"""The multi-writer protocol (RFC-22): transactions, their named steps, conflict detection, heartbeats,
liveness and the table locks. Rests on :mod:`cowrite.format` and :mod:`cowrite.storage`; knows no engine.
"""
