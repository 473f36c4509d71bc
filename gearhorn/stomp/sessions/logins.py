"""CONNECT's logins checked without stalling the bridge (runs under gevent)."""

from __future__ import annotations

import gevent

from gearhorn.rules.auth import Credentials, Principal


class Logins:
    """Checks logins against the credentials (gearhorn/rules/auth.py)."""

    def __init__(self, credentials: Credentials | None = None) -> None:
        self.credentials = credentials or Credentials.open()

    def authenticate(self, login: str | None, passcode: str | None) -> Principal | None:
        """In a thread: a hash costs ~0.05 s of CPU that must not stall every
        other connection; a refusal takes 0.2 s more."""
        if self.credentials.is_open:
            return self.credentials.authenticate(login, passcode)
        principal = gevent.get_hub().threadpool.apply(self.credentials.authenticate,
                                                      (login, passcode))
        if principal is None:
            gevent.sleep(0.2)
        return principal
