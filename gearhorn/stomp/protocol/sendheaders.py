"""What the headers of a STOMP SEND ask for (pure, no I/O).

Why it is shaped so: docs/design/notes.rst, "gearhorn/stomp/protocol/sendheaders.py".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gearhorn.errors import BadRequest
from gearhorn.rules.fanoutoptions import MAX_DELAY_SECONDS
from gearhorn.rules.messages import MAX_BATCH, parse_headers, validate_queue

TEMP_QUEUE = "/temp-queue/"
DELAY_HEADERS = ("x-delay", "AMQ_SCHEDULED_DELAY")
NOT_CARRIED = frozenset({
    "destination", "receipt", "transaction", "content-length", "persistent", *DELAY_HEADERS,
    # set by the bridge on each MESSAGE
    "message-id", "subscription", "ack", "redelivered", "delivery-count",
})


@dataclass(frozen=True)
class SendOptions:
    priority: str = "normal"
    delay: float | None = None  # seconds
    headers: dict[str, str] = field(default_factory=dict)
    temp_reply: str | None = None  # NAME, when reply-to is /temp-queue/NAME

    @property
    def plain(self) -> bool:
        """Nothing beyond the body: such SENDs may travel in one batch."""
        return self.priority == "normal" and self.delay is None and not self.headers


PLAIN = SendOptions()


@dataclass
class TopicSend:
    """SENDs to a topic, ready for one fanout job; ``message_ids`` when the
    bridge appends them to the topic's history itself (``to_append`` until
    it has), and ``needs_job`` False when no subscriber needs a copy (all
    read the history)."""

    topic: str
    bodies: list[bytes]
    options: SendOptions = PLAIN
    message_ids: list[str] | None = None
    needs_job: bool = True
    to_append: bool = False  # ids given and live readers told; not appended yet
    taken_early: bool = False  # live readers on this bridge have some of it already
    # Its writes by the topic's pen on this bridge (gearhorn/stomp/topics/offsetlease.py):
    # its readers here have it, offsets and all; appended once these are done.
    tickets: list = field(default_factory=list)
    size: int = field(init=False)  # bytes of all bodies

    def __post_init__(self) -> None:
        self.size = sum(map(len, self.bodies))

    def take(self, other: TopicSend, max_bytes: int) -> bool:
        """Add ``other``'s messages, if one job may carry both; says whether it did."""
        if (other.topic != self.topic or other.options != self.options
                or (other.message_ids is None) != (self.message_ids is None)
                or other.needs_job != self.needs_job or other.to_append != self.to_append
                or bool(other.tickets) != bool(self.tickets)
                or len(self.bodies) + len(other.bodies) > MAX_BATCH
                or self.size + other.size > max_bytes):
            return False
        self.bodies += other.bodies
        self.size += other.size
        if self.message_ids is not None and other.message_ids is not None:
            self.message_ids += other.message_ids
        self.taken_early = self.taken_early or other.taken_early
        self.tickets += other.tickets
        return True


def send_options(headers: Mapping[str, str]) -> SendOptions:
    """Read a SEND's headers; raises BadRequest with the reason."""
    carried = {k: v for k, v in headers.items() if k not in NOT_CARRIED}
    if not carried and not any(h in headers for h in DELAY_HEADERS):
        return PLAIN
    priority = jms_priority(headers["priority"]) if "priority" in headers else "normal"
    given = [h for h in DELAY_HEADERS if h in headers]
    if len(given) > 1:
        raise BadRequest("give x-delay or AMQ_SCHEDULED_DELAY, not both")
    delay = delay_seconds(given[0], headers[given[0]]) if given else None
    temp = None
    reply_to = carried.get("reply-to", "")
    if reply_to.startswith(TEMP_QUEUE):
        temp = validate_queue(reply_to[len(TEMP_QUEUE):])
    return SendOptions(priority, delay, parse_headers(carried), temp)


def jms_priority(text: str) -> str:
    """JMS priority 0-9 -> Gearman precedence (0-3 low, 4 normal, 5-9 high)."""
    if len(text) != 1 or not text.isdigit():
        raise BadRequest(f"invalid priority {text[:20]!r}: a whole number from 0 to 9")
    value = int(text)
    return "low" if value < 4 else "normal" if value == 4 else "high"


def delay_seconds(header: str, text: str) -> float | None:
    """Milliseconds in ``header`` -> seconds; None for 0 (deliver now)."""
    if not text.isdigit() or int(text) > MAX_DELAY_SECONDS * 1000:
        raise BadRequest(f"invalid {header} {text[:20]!r}: milliseconds, from 0 to "
                         f"{MAX_DELAY_SECONDS * 1000}")
    return int(text) / 1000 or None
