"""What the log says while something the gateway depends on fails (an agent,
the database): one line when it starts failing, one every `every_s` while
it lasts, one when it answers again; not one per failed call, which under
load is hundreds of lines a second."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class Outage:
    def __init__(self, log: logging.Logger, what: str, consequence: str,
                 every_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._what = what
        self._consequence = consequence
        self._every_s = every_s
        self._clock = clock
        self._since_s: float | None = None
        self._said_s = 0.0
        self.failed = 0  # calls failed in this outage
        self.failures = 0  # calls failed in all

    @property
    def down(self) -> bool:
        """Whether the last call failed."""
        return self._since_s is not None

    def fail(self, why: str) -> None:
        """A call failed because of `why`."""
        now = self._clock()
        self.failures += 1
        if self._since_s is None:
            self._since_s, self._said_s, self.failed = now, now, 1
            self._log.warning("%s: %s; %s (said again every %.0f s while it lasts)",
                              self._what, why, self._consequence, self._every_s)
            return
        self.failed += 1
        if now - self._said_s >= self._every_s:
            self._said_s = now
            self._log.warning("%s: still failing (%d calls in %.0f s): %s", self._what,
                              self.failed, now - self._since_s, why)

    def answered(self) -> None:
        """A call succeeded."""
        if self._since_s is not None:
            self._log.warning("%s answers again, after %d failed calls in %.1f s",
                              self._what, self.failed, self._clock() - self._since_s)
            self._since_s = None
