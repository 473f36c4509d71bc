"""The name changes a strict tests/lossyfs.py holds back until their
folder is fsynced: a journal to undo at the power cut, newest first, and a
graveyard beside the backing folder for what was removed or overwritten
meanwhile (it comes back if the removal never reached the disk)."""

from __future__ import annotations

import itertools
import os
import shutil
from dataclasses import dataclass


@dataclass
class NameChange:
    """A change of folder entries not yet on disk (strict metadata): what
    to undo at a cut, and the folders (by inode) whose fsync covers it."""

    kind: str  # create, mkdir, unlink, rmdir, rename
    where: tuple[int, str]  # (folder inode, name): the name made, or removed
    inode: int
    pending: set[int]
    came_from: tuple[int, str] | None = None  # a rename's old name
    grave: str | None = None  # what was removed or overwritten, kept until on disk


class Names:
    """The journal of name changes (strict metadata) and its graveyard."""

    def __init__(self, backing: str) -> None:
        self.backing = backing
        self.graveyard = backing.rstrip("/") + ".graveyard"
        os.makedirs(self.graveyard, exist_ok=True)
        self.journal: list[NameChange] = []
        self._graves = itertools.count()

    def where(self, real: str) -> tuple[int, str]:
        return os.lstat(os.path.dirname(real)).st_ino, os.path.basename(real)

    def bury(self, real: str) -> str:
        """Move ``real`` into the graveyard; its grave's path."""
        grave = os.path.join(self.graveyard, str(next(self._graves)))
        os.rename(real, grave)
        return grave

    def record(self, kind: str, real: str, inode: int, came_from: str | None = None,
               grave: str | None = None) -> None:
        where = self.where(real)
        old = self.where(came_from) if came_from else None
        pending = {where[0]} | ({old[0]} if old else set())
        self.journal.append(NameChange(kind, where, inode, pending, old, grave))

    def synced(self, folder_inode: int) -> None:
        """The folder is fsynced: what it names is on disk."""
        for change in self.journal:
            change.pending.discard(folder_inode)
        for change in [c for c in self.journal if not c.pending]:
            if change.grave is not None:
                _remove(change.grave)
        self.journal = [c for c in self.journal if c.pending]

    def undo(self) -> int:
        """The cut: put back every change not on disk, newest first."""
        undone = 0
        for change in reversed(self.journal):
            folders = self._folders()
            path = _at(folders, change.where)
            if path is None:
                continue  # its folder itself was never on disk: gone with it
            if change.kind in ("create", "mkdir"):
                if inode_of(path) == change.inode:
                    _remove(path)
            elif change.kind in ("unlink", "rmdir"):
                os.rename(change.grave, path)
            else:  # rename: back to the old name, and the overwritten one back
                old = _at(folders, change.came_from)
                if old is not None and inode_of(path) == change.inode:
                    os.rename(path, old)
                if change.grave is not None:
                    os.rename(change.grave, path)
            undone += 1
        self.journal.clear()
        for name in os.listdir(self.graveyard):
            _remove(os.path.join(self.graveyard, name))
        return undone

    def _folders(self) -> dict[int, str]:
        found = {os.lstat(self.backing).st_ino: self.backing}
        for top, dirs, _ in os.walk(self.backing):
            for name in dirs:
                path = os.path.join(top, name)
                found[os.lstat(path).st_ino] = path
        return found


def _at(folders: dict[int, str], where: tuple[int, str] | None) -> str | None:
    if where is None or where[0] not in folders:
        return None
    return os.path.join(folders[where[0]], where[1])


def inode_of(path: str) -> int | None:
    try:
        return os.lstat(path).st_ino
    except FileNotFoundError:
        return None


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
