"""Who may look at the console and who may act, by the bridge's rules. Pure.

HTTP Basic with the users of the bridge's credentials file
(``stomp_credentials_file``): any user who logs in may look; a user with
``admin = true`` may requeue and purge. Without a login, the ``[anonymous]``
section decides, as it does for STOMP; without a credentials file the
console is open, like the bridge. ``/metrics`` and the health checks are
not behind this (docs/security.rst).
"""

from __future__ import annotations

import base64
import binascii

from gearhorn.rules.auth import Credentials, Principal

REALM = 'Basic realm="gearhorn", charset="UTF-8"'


def principal(credentials: Credentials, authorization: str | None) -> Principal | None:
    """The principal for an ``Authorization`` header (or its absence); None: refused."""
    if not authorization:
        return credentials.authenticate(None, None)
    scheme, _, encoded = authorization.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        login, sep, passcode = base64.b64decode(encoded.strip(), validate=True).decode(
            "utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    if not sep:
        return None
    return credentials.authenticate(login, passcode)
