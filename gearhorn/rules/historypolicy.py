"""Which topics keep a history, how much and how long: pure, no I/O.

Why it is shaped so: docs/design/notes.rst, "gearhorn/rules/historypolicy.py".
"""

from __future__ import annotations

from dataclasses import dataclass

from gearhorn.errors import BadRequest
from gearhorn.rules.messages import PREFIX_WILDCARD, validate_topic


class HistoryPolicyError(ValueError):
    """A ``history_topics`` item that cannot be used; the message says which."""


@dataclass(frozen=True, slots=True)
class Mode:
    """How one topic's history is kept."""

    size: int  # messages kept (about: trimmed with ~); 0: none
    ttl: int  # seconds: after the last message; while_read: after the last reader left
    while_read: bool = False  # kept only while it has readers (and ttl after)


@dataclass(frozen=True, slots=True)
class HistoryPolicy:
    size: int  # messages kept per topic (about: trimmed with ~); 0: none
    ttl: int  # seconds kept after the topic's last message
    overrides: tuple[tuple[str, int, int], ...] = ()  # (pattern, size, ttl), longest first
    realtime: tuple[int, int] = (0, 300)  # (size, ttl) of a topic's history while read

    @classmethod
    def parse(cls, text: str, size: int, ttl: float,
              realtime: tuple[int, float] = (0, 300)) -> HistoryPolicy:
        default_ttl = max(1, int(ttl))
        overrides = [_item(part.strip(), default_ttl) for part in text.split(",")
                     if part.strip()]
        overrides.sort(key=lambda item: len(item[0]), reverse=True)
        return cls(size, default_ttl, tuple(overrides),
                   (max(0, realtime[0]), max(1, int(realtime[1]))))

    @property
    def enabled(self) -> bool:
        """Whether any topic may keep a history."""
        return (self.size > 0 or self.realtime[0] > 0
                or any(size > 0 for _, size, _ in self.overrides))

    def of(self, topic: str) -> tuple[int, int]:
        """(size, ttl) configured for ``topic`` (history_size, history_topics)."""
        return self._configured(topic) or (self.size, self.ttl)

    def mode(self, topic: str) -> Mode:
        """How ``topic``'s history is kept: as configured; else, with real-time
        topics on, while it has readers."""
        configured = self._configured(topic)
        if configured is not None or self.size > 0 or self.realtime[0] == 0:
            return Mode(*(configured or (self.size, self.ttl)))
        return Mode(*self.realtime, while_read=True)

    def keeps(self, topic: str) -> bool:
        """Whether ``topic`` keeps a history whether or not anyone reads it."""
        mode = self.mode(topic)
        return mode.size > 0 and not mode.while_read

    def readable(self, topic: str) -> bool:
        """Whether a STOMP subscription may read ``topic``'s history."""
        return self.mode(topic).size > 0

    def _configured(self, topic: str) -> tuple[int, int] | None:
        for pattern, size, ttl in self.overrides:
            if (topic.startswith(pattern[:-1]) if pattern.endswith(PREFIX_WILDCARD)
                    else topic == pattern):
                return size, ttl
        return None


def _item(text: str, default_ttl: int) -> tuple[str, int, int]:
    pattern, sep, value = text.partition("=")
    if not sep:
        raise HistoryPolicyError(f"{text!r}: expected PATTERN=SIZE or PATTERN=SIZE/TTL")
    try:
        validate_topic(pattern.strip(), allow_prefix=True)
    except BadRequest as exc:
        raise HistoryPolicyError(f"{text!r}: {exc}") from None
    size, _, ttl = value.partition("/")
    try:
        numbers = int(size), (int(ttl) if ttl.strip() else default_ttl)
    except ValueError:
        raise HistoryPolicyError(f"{text!r}: SIZE and TTL are whole numbers") from None
    if numbers[0] < 0 or numbers[1] < 1:
        raise HistoryPolicyError(f"{text!r}: SIZE must be 0 or more, TTL 1 or more")
    return pattern.strip(), *numbers
