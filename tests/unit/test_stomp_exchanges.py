"""RabbitMQ's /exchange/ destinations read as topics (gearhorn/stomp/protocol/exchanges.py)."""

import pytest

from gearhorn.stomp.protocol.exchanges import canonical
from gearhorn.stomp.protocol.rules import ProtocolError, parse_destination


@pytest.mark.parametrize("destination, topic", [
    ("/exchange/amq.topic/news.sport", "news.sport"),  # the same as /topic/news.sport
    ("/exchange/amq.fanout", "amq.fanout"),
    ("/exchange/amq.fanout/any-key", "amq.fanout"),  # a fanout ignores the key
    ("/exchange/amq.direct/orders", "amq.direct.orders"),
    ("/exchange/amq.direct", "amq.direct"),
])
def test_the_standard_exchanges_are_topics(destination, topic):
    assert parse_destination(destination) == parse_destination(f"/topic/{topic}")


@pytest.mark.parametrize("destination, title, detail", [
    ("/exchange", "Invalid destination", "'' is not a valid exchange destination\n"),
    ("/exchange//foo", "Invalid destination", "'//foo' is not a valid exchange destination\n"),
    ("/exchange/bah/baz/boo", "Invalid destination",
     "'/bah/baz/boo' is not a valid exchange destination\n"),
    ("/exchange/amq.topic", "Invalid destination",
     "'/amq.topic' is not a valid exchange destination: amq.topic needs a routing key\n"),
    ("/exchange/does.not.exist", "not_found", "no exchange 'does.not.exist' in vhost '/'"),
    ("/exchange/amq.topic/has space", "Invalid destination", "invalid topic"),
])
def test_other_exchanges_get_rabbitmqs_errors(destination, title, detail):
    with pytest.raises(ProtocolError) as caught:
        parse_destination(destination)
    assert caught.value.title == title and str(caught.value).startswith(detail)


def test_a_topic_exchange_destination_is_named_as_the_topic():
    assert canonical("/exchange/amq.topic/a.b") == "/topic/a.b"
    assert canonical("/exchange/amq.fanout") == "/exchange/amq.fanout"
    assert canonical("/queue/q") == "/queue/q"
