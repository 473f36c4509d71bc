"""Which topics keep a history, how much and how long: pure, no I/O.

``history_size`` and ``history_ttl`` are every topic's; ``history_topics``
overrides them for some, as ``PATTERN=SIZE[/TTL]`` items separated by
commas, where PATTERN is a topic or a prefix ending in ``*`` (the longest
match wins, as a Centrifugo namespace's options do)::

    >>> policy = HistoryPolicy.parse("chat.*=1000/600, chat.admin=0", 0, 3600)
    >>> policy.of("chat.room1"), policy.of("chat.admin"), policy.of("news")
    ((1000, 600), (0, 3600), (0, 3600))
    >>> policy.enabled
    True
"""

from __future__ import annotations

from dataclasses import dataclass

from gearhorn.messages import PREFIX_WILDCARD, BadRequest, validate_topic


class HistoryPolicyError(ValueError):
    """A ``history_topics`` item that cannot be used; the message says which."""


@dataclass(frozen=True, slots=True)
class HistoryPolicy:
    size: int  # messages kept per topic (about: trimmed with ~); 0: none
    ttl: int  # seconds kept after the topic's last message
    overrides: tuple[tuple[str, int, int], ...] = ()  # (pattern, size, ttl), longest first

    @classmethod
    def parse(cls, text: str, size: int, ttl: float) -> HistoryPolicy:
        default_ttl = max(1, int(ttl))
        overrides = [_item(part.strip(), default_ttl) for part in text.split(",")
                     if part.strip()]
        overrides.sort(key=lambda item: len(item[0]), reverse=True)
        return cls(size, default_ttl, tuple(overrides))

    @property
    def enabled(self) -> bool:
        """Whether any topic keeps a history."""
        return self.size > 0 or any(size > 0 for _, size, _ in self.overrides)

    def of(self, topic: str) -> tuple[int, int]:
        """(size, ttl) for ``topic``."""
        for pattern, size, ttl in self.overrides:
            if (topic.startswith(pattern[:-1]) if pattern.endswith(PREFIX_WILDCARD)
                    else topic == pattern):
                return size, ttl
        return self.size, self.ttl

    def keeps(self, topic: str) -> bool:
        return self.of(topic)[0] > 0


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
