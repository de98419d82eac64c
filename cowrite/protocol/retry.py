"""A retry policy as a small value: tries, exponential backoff with jitter, and a deadline.

The clock and the sleep are injectable so tests never sleep for real.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class RetryPolicy:
    max_tries: int | None = None  # None: until the deadline
    delay: float = 0.01  # seconds before the second try
    backoff: float = 2.0
    max_delay: float = 1.0
    jitter: float = 0.5  # each pause is scaled by a random factor in [1 - jitter, 1]
    deadline: float | None = None  # seconds from start; None: no deadline
    floor: Callable[[], float] = lambda: 0.0  # seconds no pause is shorter than (before the jitter)
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.Random)

    def attempts(self) -> Attempts:
        return Attempts(self)


class Attempts:
    """Iterate to get permission for each try: ``for _ in policy.attempts(): if try_it(): break``.

    The loop ends (without raising) when tries or time run out; the caller decides what that means.
    """

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.tries = 0
        self.started = policy.clock()

    def __iter__(self) -> Attempts:
        return self

    def remaining(self) -> float | None:
        if self.policy.deadline is None:
            return None
        return self.policy.deadline - (self.policy.clock() - self.started)

    def __next__(self) -> int:
        policy = self.policy
        if policy.max_tries is not None and self.tries >= policy.max_tries:
            raise StopIteration
        if self.tries:
            # the exponent stops growing once the pause is at its maximum (a float power overflows at ~1000)
            growth = policy.backoff ** min(self.tries - 1, 64)
            pause = max(min(policy.max_delay, policy.delay * growth), policy.floor())
            pause *= 1 - policy.jitter * policy.rng.random()
            remaining = self.remaining()
            if remaining is not None:
                if remaining <= 0:
                    raise StopIteration
                pause = min(pause, remaining)
            policy.sleep(pause)
        self.tries += 1
        return self.tries
