"""Who may connect to the bridge, and where they may send and subscribe.

Why it is shaped so: docs/design/notes.rst, "gearhorn/rules/auth.py".
"""

from __future__ import annotations

import base64
import configparser
import fnmatch
import hashlib
import hmac
import os
from dataclasses import dataclass
from io import StringIO

from gearhorn.errors import GearhornError

SCHEME = "pbkdf2_sha256"
# About 0.05 s of one core per check: slow for a guesser, and the bridge runs
# checks in a thread pool and remembers passcodes it verified (by digest).
ITERATIONS = 200_000
ANONYMOUS = "anonymous"


class CredentialsError(GearhornError, ValueError):
    """The credentials file cannot be used; the message says where and why."""


@dataclass(frozen=True)
class Principal:
    """A connected user and what they may touch."""

    name: str
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    admin: bool = False  # may requeue and purge dead letters (gearhorn web)

    def may_read(self, destination: str) -> bool:
        return _allowed(self.read, destination)

    def may_write(self, destination: str) -> bool:
        return _allowed(self.write, destination)


OPEN = Principal(ANONYMOUS, ("*",), ("*",), admin=True)


def _allowed(patterns: tuple[str, ...], destination: str) -> bool:
    return any(fnmatch.fnmatchcase(destination, p) for p in patterns)


def hash_passcode(passcode: str, iterations: int = ITERATIONS, salt: bytes | None = None) -> str:
    salt = salt or os.urandom(16)
    digest = hashlib.pbkdf2_hmac("sha256", passcode.encode(), salt, iterations)
    return f"{SCHEME}${iterations}${_b64(salt)}${_b64(digest)}"


def verify_passcode(passcode: str, encoded: str) -> bool:
    scheme, iterations, salt, digest = encoded.split("$")
    if scheme != SCHEME:
        return False
    computed = hashlib.pbkdf2_hmac("sha256", passcode.encode(), _unb64(salt), int(iterations))
    return hmac.compare_digest(computed, _unb64(digest))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class User:
    passcode_hash: str
    principal: Principal


class Credentials:
    """The users of one credentials file (or, with none, an open bridge)."""

    def __init__(self, users: dict[str, User], anonymous: Principal | None) -> None:
        self.users = users
        self.anonymous = anonymous
        self._verified: set[tuple[str, bytes]] = set()  # (user, sha256 of a good passcode)

    @classmethod
    def open(cls) -> Credentials:
        return cls({}, OPEN)

    @property
    def is_open(self) -> bool:
        return self.anonymous is OPEN

    def authenticate(self, login: str | None, passcode: str | None) -> Principal | None:
        """The principal for a CONNECT's login/passcode, or None (refused)."""
        if self.is_open:
            return OPEN
        if login is None:
            return self.anonymous
        user = self.users.get(login)
        if user is None or passcode is None:
            return None
        key = (login, hashlib.sha256(passcode.encode()).digest())
        if key in self._verified:
            return user.principal
        if not verify_passcode(passcode, user.passcode_hash):
            return None
        if len(self._verified) > 10_000:
            self._verified.clear()
        self._verified.add(key)
        return user.principal


def parse(text: str, source: str = "credentials") -> Credentials:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text, source)
    except configparser.Error as exc:
        raise CredentialsError(f"{source}: {exc}") from None
    users, anonymous = {}, None
    for section in parser.sections():
        rights = parser[section]
        unknown = set(rights) - {"passcode", "read", "write", "admin"}
        if unknown:
            raise CredentialsError(f"{source}: [{section}]: unknown key {sorted(unknown)[0]!r}")
        read, write = _patterns(rights.get("read", "")), _patterns(rights.get("write", ""))
        try:
            admin = rights.getboolean("admin", fallback=False)
        except ValueError:
            raise CredentialsError(f"{source}: [{section}]: admin must be true or false, "
                                   f"got {rights['admin']!r}") from None
        if section == ANONYMOUS:
            anonymous = Principal(ANONYMOUS, read, write, admin)
            continue
        kind, _, name = section.partition(" ")
        if kind != "user" or not name.strip():
            raise CredentialsError(f"{source}: [{section}]: sections are [user NAME] or "
                                   "[anonymous]")
        name = name.strip()
        encoded = rights.get("passcode", "")
        if not _is_hash(encoded):
            raise CredentialsError(f"{source}: user {name!r}: passcode must be a "
                                   f"{SCHEME} hash (make one with `gearhorn passwd`), "
                                   "never the passcode itself")
        users[name] = User(encoded, Principal(name, read, write, admin))
    return Credentials(users, anonymous)


def load(path: str) -> Credentials:
    try:
        with open(path, encoding="utf-8") as fp:
            return parse(fp.read(), path)
    except OSError as exc:
        raise CredentialsError(f"cannot read credentials file {path}: {exc.strerror}") from None


def _patterns(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.replace("\n", ",").split(",") if p.strip())


def _is_hash(encoded: str) -> bool:
    parts = encoded.split("$")
    return len(parts) == 4 and parts[0] == SCHEME and parts[1].isdigit() and all(parts[2:])


def set_passcode(text: str, user: str, passcode: str) -> str:
    """The credentials file ``text`` with ``user``'s passcode (re)set, hashed;
    a new user gets no rights until read/write lines are added."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(text)
    section = f"user {user}"
    if not parser.has_section(section):
        parser.add_section(section)
        parser[section]["read"] = ""
        parser[section]["write"] = ""
    parser[section]["passcode"] = hash_passcode(passcode)
    out = StringIO()
    parser.write(out)
    return out.getvalue()


def save_passcode(path: str, user: str, passcode: str) -> None:
    """Set ``user``'s passcode (hashed) in the credentials file at ``path``,
    made if absent, readable by its owner only."""
    try:
        with open(path, encoding="utf-8") as fp:
            text = fp.read()
    except FileNotFoundError:
        text = ""
    updated = set_passcode(text, user, passcode)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fp:
        fp.write(updated)
