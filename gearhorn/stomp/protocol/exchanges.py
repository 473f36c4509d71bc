"""RabbitMQ's ``/exchange/...`` destinations, read as gearhorn topics: pure.

A STOMP client written for RabbitMQ names its broadcasts by exchange. Its
three standard exchanges have a gearhorn meaning, so such a client works
unchanged (docs/stomp.rst, "Destinations"):

- ``/exchange/amq.topic/K`` is ``/topic/K``, as in RabbitMQ itself;
- ``/exchange/amq.fanout[/K]`` is the topic ``amq.fanout``: a fanout
  exchange ignores the routing key;
- ``/exchange/amq.direct/K`` is the topic ``amq.direct.K``: a direct
  exchange matches the key exactly, as one topic per key does.

Any other exchange does not exist here: RabbitMQ's ``not_found``.
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
