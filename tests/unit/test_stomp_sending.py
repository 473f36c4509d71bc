import pytest

from gearhorn.errors import BadRequest
from gearhorn.stomp.protocol.sendheaders import PLAIN, jms_priority, send_options


def test_a_frame_without_options_is_plain():
    assert send_options({"destination": "/queue/a", "content-length": "3",
                         "receipt": "r1"}) is PLAIN


@pytest.mark.parametrize("value", ["true", "false"])
def test_persistent_is_the_deployments_business_and_keeps_a_send_plain(value):
    # RabbitMQ clients set it on every SEND; carried, it would cost a Redis
    # write per message and keep the SEND out of a batch.
    assert send_options({"destination": "/topic/t", "persistent": value}) is PLAIN
    assert "persistent" not in send_options({"persistent": "true", "x-a": "1"}).headers


@pytest.mark.parametrize("value, precedence", [
    ("0", "low"), ("3", "low"), ("4", "normal"), ("5", "high"), ("9", "high")])
def test_jms_priorities_map_to_gearman_precedence(value, precedence):
    assert jms_priority(value) == precedence


def test_options_and_carried_headers():
    opts = send_options({"destination": "/queue/a", "priority": "9", "x-delay": "1500",
                         "content-type": "application/json", "correlation-id": "c1",
                         "reply-to": "/temp-queue/answers", "x-custom": "a\nb"})
    assert opts.priority == "high" and opts.delay == 1.5 and not opts.plain
    assert opts.temp_reply == "answers"
    assert opts.headers == {"priority": "9", "content-type": "application/json",
                            "correlation-id": "c1", "reply-to": "/temp-queue/answers",
                            "x-custom": "a\nb"}
    assert send_options({"AMQ_SCHEDULED_DELAY": "250"}).delay == 0.25
    assert send_options({"x-delay": "0"}).delay is None


@pytest.mark.parametrize("headers, reason", [
    ({"priority": "10"}, "invalid priority '10': a whole number from 0 to 9"),
    ({"priority": "high"}, "invalid priority 'high'"),
    ({"x-delay": "-5"}, "invalid x-delay '-5': milliseconds"),
    ({"x-delay": "soon"}, "invalid x-delay 'soon'"),
    ({"AMQ_SCHEDULED_DELAY": "99999999999999"}, "invalid AMQ_SCHEDULED_DELAY"),
    ({"x-delay": "1", "AMQ_SCHEDULED_DELAY": "1"}, "not both"),
    ({"reply-to": "/temp-queue/has space"}, "invalid queue name"),
    ({f"h{i}": "v" for i in range(65)}, "more than 64 headers"),
])
def test_bad_options_are_refused_with_a_reason(headers, reason):
    with pytest.raises(BadRequest) as exc:
        send_options(headers)
    assert reason in str(exc.value)
