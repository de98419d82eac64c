"""Errors of the Spark engine, and how errors raised on executors reach the driver typed.

A cowrite error raised inside a Spark task reaches the driver as a ``PythonException`` whose text ends
with the task's traceback (``cowrite.errors.SchemaError: <message>``). :func:`translate` turns
it back into the cowrite error it was, so callers (and the CLI's exit codes) see a ``SchemaError`` or a
``LeaseLostError``, not a Spark exception. Any other failure of a Spark job becomes
:class:`SparkJobError`: the write did not commit.
"""

from __future__ import annotations

import re

from cowrite.errors import CommitFailedError, CowriteError


class SparkJobError(CommitFailedError):
    """A Spark job of the write failed (a task, an executor, the cluster); nothing was committed."""


class NondeterministicInputError(CommitFailedError):
    """The input gave other rows the second time it was computed, so the planned files no longer fit.

    An upsert, delete or insert_overwrite reads its input twice (once to count, once to write); a
    DataFrame that changes between two evaluations (non-deterministic functions, a changing source) must
    be persisted first. (Inserts read their input once.)
    """

    def __init__(self, task: int, partition: str, planned: int, seen: int) -> None:
        super().__init__(
            f"task {task} saw {seen} records of partition '{partition}' where counting saw {planned}: the "
            "input changed between its two evaluations. Persist or checkpoint the DataFrame, then re-run; "
            "nothing was committed"
        )


# The last line of a Python traceback naming a cowrite error: "cowrite.<module>.<Name>: <message>".
_REMOTE_ERROR = re.compile(r"^cowrite(?:\.\w+)+\.(\w+): (.*)$", re.MULTILINE)
# The last line of any Python traceback: "<dotted exception name>: <message>".
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)(?::|$)")


def _error_classes() -> dict[str, type[CowriteError]]:
    found: dict[str, type[CowriteError]] = {}
    pending: list[type[CowriteError]] = [CowriteError]
    while pending:
        kind = pending.pop()
        found[kind.__name__] = kind
        pending.extend(kind.__subclasses__())
    return found


def translate(exc: BaseException) -> CowriteError:
    """The cowrite error behind a failed Spark job, or a :class:`SparkJobError` describing it."""
    if isinstance(exc, CowriteError):
        return exc
    text = str(exc)
    matches = _REMOTE_ERROR.findall(text)
    kinds = _error_classes()
    for name, message in reversed(matches):
        kind = kinds.get(name)
        if kind is not None:
            error = kind.__new__(kind)  # its own __init__ may want more than the message
            error.args = (message.strip(),)
            return error
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    raised = [line for line in lines if _RAISED.match(line)]
    summary = raised[-1] if raised else lines[0] if lines else type(exc).__name__
    return SparkJobError(f"a Spark job of the write failed, nothing was committed: {summary}")
