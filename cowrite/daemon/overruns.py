"""Polls that could not start because the table's previous poll was still running.

The scheduler skips such a poll, and apscheduler would log a warning for every skip. A daemon that
starts on many long histories on an object store spends minutes on its first polls, and that would be a
warning per table every interval, thousands of lines. The daemon counts the skips instead
(``cowrite_polls_skipped_total``) and logs one line per poll that overran, at its first skip.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from apscheduler.events import JobSubmissionEvent
from prometheus_client import Counter

log = logging.getLogger(__name__)

_APSCHEDULER_SKIP = 'Execution of job "%s" skipped'  # the start of apscheduler's message for a skip


class Polled(Protocol):
    """The part of a table's service this needs: its name, and how many of its polls have ended."""

    name: str
    polls: int


class PollOverruns:
    """The scheduler's listener for skipped jobs (``EVENT_JOB_MAX_INSTANCES``) of the poll jobs named
    ``job_id(index)``, one per service in ``services``. Creating one also silences apscheduler's own
    warning for each skip, in this process."""

    def __init__(
        self, services: Sequence[Polled], job_id: Callable[[int], str], skipped: Counter, interval: float
    ) -> None:
        self._services = {job_id(index): service for index, service in enumerate(services)}
        self._skipped = skipped
        self._interval = interval
        self._logged: dict[str, int] = {}  # job id -> the poll (by number) last logged as overrunning
        logging.getLogger("apscheduler.scheduler").addFilter(_not_a_skip)  # the same function: added once

    def __call__(self, event: JobSubmissionEvent) -> None:
        service = self._services.get(event.job_id)
        if service is None:  # a cleaning's: the next one runs on time (cowrite_cleaner_duration_seconds)
            return
        self._skipped.labels(service.name).inc()
        polls = service.polls
        if self._logged.get(event.job_id) == polls:
            return
        self._logged[event.job_id] = polls
        if polls == 0:
            log.info("table %s: its first poll is still running; later polls wait for it", service.name)
        else:
            log.warning(
                "table %s: a poll is taking longer than the poll interval (%g s); later polls wait for it",
                service.name,
                self._interval,
            )


def _not_a_skip(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_APSCHEDULER_SKIP)
