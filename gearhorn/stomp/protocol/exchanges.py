"""RabbitMQ's ``/exchange/...`` destinations, read as gearhorn topics: pure.

Why it is shaped so: docs/design/notes.rst, "gearhorn/stomp/protocol/exchanges.py".
"""

from __future__ import annotations

NOT_FOUND = "not_found"  # RabbitMQ's ERROR message for an unknown exchange
INVALID = "Invalid destination"


class ExchangeError(Exception):
    def __init__(self, detail: str, title: str) -> None:
        super().__init__(detail)
        self.title = title


def exchange_topic(rest: str) -> str:
    """The topic behind ``/exchange<rest>`` (``rest`` starts with ``/``)."""
    exchange, _, key = rest[1:].partition("/")
    if not rest.startswith("/") or not exchange or "/" in key:
        raise ExchangeError(f"'{rest}' is not a valid exchange destination\n", INVALID)
    if exchange == "amq.fanout":
        return exchange
    if exchange == "amq.topic" and key:
        return key
    if exchange == "amq.direct":
        return f"{exchange}.{key}" if key else exchange
    if exchange == "amq.topic":
        raise ExchangeError(f"'{rest}' is not a valid exchange destination: "
                            "amq.topic needs a routing key\n", INVALID)
    raise ExchangeError(f"no exchange '{exchange}' in vhost '/'", NOT_FOUND)


TOPIC_EXCHANGE = "/exchange/amq.topic/"


def canonical(destination: str) -> str:
    """``/exchange/amq.topic/K`` is ``/topic/K`` in RabbitMQ, and its MESSAGE
    frames say so: the one destination both names share."""
    if destination.startswith(TOPIC_EXCHANGE):
        return "/topic/" + destination[len(TOPIC_EXCHANGE):]
    return destination
