"""Cutting a torn append-only file back to its last complete command.

Why it is shaped so: docs/design/notes.rst, "gearhorn/supervision/aofrepair.py".
"""

from __future__ import annotations

import logging
import os
import shutil
import time

log = logging.getLogger(__name__)

MANIFEST_SUFFIX = ".manifest"


def complete_prefix(data: bytes | memoryview) -> int:
    """How many bytes of ``data`` are whole commands, outside any open
    MULTI (timestamp annotations, ``#TS:...`` lines, count as whole).

    >>> complete_prefix(b"*1\\r\\n$4\\r\\nPING\\r\\n*1\\r\\n$4\\r\\nPI")
    14
    >>> complete_prefix(b"*1\\r\\n$5\\r\\nMULTI\\r\\n*1\\r\\n$4\\r\\nPING\\r\\n")
    0
    >>> complete_prefix(b"*1\\r\\n$4\\r\\nPING\\r\\n\\0\\0\\0\\0")
    14
    """
    data = bytes(data)
    pos, good, multi = 0, 0, False
    end = len(data)
    while pos < end:
        parsed = _command(data, pos)
        if parsed is None:
            break
        pos, name = parsed
        if name == b"multi":
            multi = True
        elif name in (b"exec", b"discard"):
            multi = False
        if not multi:
            good = pos
    return good


def _command(data: bytes, pos: int) -> tuple[int, bytes] | None:
    """The end of the command at ``pos`` and its lower-cased name (b"" for an
    annotation), or None if it is not whole."""
    if data.startswith(b"#", pos):
        line_end = data.find(b"\r\n", pos)
        return None if line_end < 0 else (line_end + 2, b"")
    count, pos = _number(data, pos, b"*")
    if count is None or count < 1:
        return None
    name = b""
    for index in range(count):
        length, pos = _number(data, pos, b"$")
        if length is None or length < 0 or data[pos + length:pos + length + 2] != b"\r\n":
            return None
        if index == 0:
            name = data[pos:pos + length].lower()
        pos += length + 2
    return pos, name


def _number(data: bytes, pos: int, marker: bytes) -> tuple[int | None, int]:
    """``<marker><digits>\\r\\n`` at ``pos``: the number and where it ends."""
    if not data.startswith(marker, pos):
        return None, pos
    line_end = data.find(b"\r\n", pos + 1, pos + 22)
    digits = data[pos + 1:line_end] if line_end > 0 else b""
    if not digits.isdigit():
        return None, pos
    return int(digits), line_end + 2


def increments(data_dir: str, folder: str = "appendonlydir",
               filename: str = "appendonly.aof") -> list[str]:
    """The AOF files Redis appends to, oldest first: the ``incr`` files its
    manifest lists (Redis 7), or Redis 6's ``appendonly.aof``.

    The manifest is the one Redis loads, ``<filename>.manifest``: a crash in
    the middle of a rewrite leaves ``temp-<filename>.manifest`` beside it,
    which Redis never reads."""
    manifest = os.path.join(data_dir, folder, filename + MANIFEST_SUFFIX)
    if os.path.isfile(manifest):
        return [os.path.join(data_dir, folder, name) for name in _incr_names(manifest)]
    single = os.path.join(data_dir, filename)
    return [single] if os.path.isfile(single) else []


def _incr_names(manifest: str) -> list[str]:
    """``file <name> seq <n> type i`` lines, in the order Redis loads them."""
    found = []
    with open(manifest, encoding="utf-8", errors="replace") as fp:
        for line in fp:
            words = line.split()
            fields = dict(zip(words[::2], words[1::2], strict=False))
            if fields.get("type") == "i" and "file" in fields:
                found.append((int(fields.get("seq", 0)), fields["file"]))
    return [name for _, name in sorted(found)]


def repair(data_dir: str, folder: str = "appendonlydir",
           filename: str = "appendonly.aof") -> list[str]:
    """Cut the torn files of the AOF in ``data_dir``; returns one line per
    file changed (also logged). Safe to run on a whole AOF: it changes
    nothing."""
    done: list[str] = []
    torn = False
    for path in increments(data_dir, folder, filename):
        if not os.path.isfile(path):
            continue
        size = os.path.getsize(path)
        if torn:  # after a hole: nothing here can have been acknowledged
            if size:
                done.append(_cut(path, 0, size))
            continue
        with open(path, "rb") as fp:
            if fp.read(5) == b"REDIS":
                continue  # Redis 6's RDB preamble: Redis checks that part itself
        with open(path, "rb") as fp:
            keep = complete_prefix(fp.read())
        if keep < size:
            done.append(_cut(path, keep, size))
            torn = True
    return done


def _cut(path: str, keep: int, size: int) -> str:
    """Keep a copy of ``path``, then truncate it to ``keep`` bytes."""
    copy = f"{path}.torn-{time.strftime('%Y%m%dT%H%M%S')}"
    shutil.copy2(path, copy)
    with open(path, "r+b") as fp:
        fp.truncate(keep)
        fp.flush()
        os.fsync(fp.fileno())
    line = (f"{os.path.basename(path)}: cut {size - keep} bytes after its last complete "
            f"command (offset {keep}), written after the last fsync; the original is in "
            f"{os.path.basename(copy)}")
    log.warning("torn append-only file repaired: %s", line)
    return line
