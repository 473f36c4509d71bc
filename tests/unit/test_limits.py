"""Subscription limits and what a bounded queue gives up (pure logic)."""

import pytest

from gearhorn.errors import BadRequest
from gearhorn.rules.limits import (
    Limits,
    limits_from_headers,
    limits_from_job,
    limits_from_json,
    limits_to_json,
)
from gearhorn.rules.messages import parse_subscription
from gearhorn.rules.retention import Tallied, TallyEntry, judge

pytestmark = pytest.mark.timeout(30)
DEFAULTS = Limits(100_000, 0, 0.0, 0.0, "drop-head", False)


def test_subscribe_keys_are_parsed_and_fill_in_over_the_defaults():
    sub = parse_subscription(b'{"topic": "t", "client_id": "c", "max_length": 100, '
                             b'"overflow": "reject-publish", "message_ttl": 1.5}')
    assert sub.limits == Limits(max_length=100, message_ttl=1.5, overflow="reject-publish")
    assert sub.limits.over(DEFAULTS) == Limits(100, 0, 1.5, 0.0, "reject-publish", False)
    assert parse_subscription(b'{"topic": "t", "client_id": "c"}').limits is None


@pytest.mark.parametrize("job, error", [
    ({"max_length": -1}, "max_length must be 0 (no limit) or more, got -1"),
    ({"max_length": "10"}, "max_length must be a whole number of copies, got '10'"),
    ({"max_bytes": 1.5}, "max_bytes must be a whole number of bytes, got 1.5"),
    ({"message_ttl": True}, "message_ttl must be a number of seconds, got True"),
    ({"expires": -3}, "expires must be 0 (off) to"),
    ({"overflow": "drop-tail"}, "overflow must be drop-head or reject-publish, got 'drop-tail'"),
    ({"dead_letter": "yes"}, "dead_letter must be true or false, got 'yes'"),
])
def test_invalid_limits_get_a_one_line_error(job, error):
    with pytest.raises(BadRequest) as caught:
        limits_from_job(job)
    assert str(caught.value).startswith(error) and "\n" not in str(caught.value)


def test_stomp_headers_are_rabbitmqs_with_milliseconds():
    limits = limits_from_headers({"x-max-length": "100", "x-message-ttl": "2500",
                                  "x-expires": "60000", "x-overflow": "reject-publish",
                                  "x-dead-letter-exchange": "dlx"})
    assert limits == Limits(max_length=100, message_ttl=2.5, expires=60.0,
                            overflow="reject-publish", dead_letter=True)
    assert limits_from_headers({"id": "1"}) is None
    with pytest.raises(BadRequest, match="x-max-length must be a whole number, got 'ten'"):
        limits_from_headers({"x-max-length": "ten"})


def test_limits_survive_json():
    limits = Limits(max_length=5, dead_letter=True)
    assert limits_from_json(limits_to_json(limits)) == limits
    assert limits_from_json('{"max_length": 5, "from_the_future": 1}') == Limits(max_length=5)


def entries(*counts, start=1000, size=10):
    """One entry per count, a second apart, ``size`` bytes a copy."""
    return [TallyEntry(start + i * 1000, n, n * size) for i, n in enumerate(counts)]


def tallied(window):
    return Tallied(sum(e.count for e in window), sum(e.size for e in window), window)


def test_consumed_entries_are_those_older_than_the_queued_copies():
    window = entries(3, 2, 4)  # 9 copies tallied, 5 still queued: the first
    verdict = judge(tallied(window), 5, 0, DEFAULTS, 10_000)
    assert (verdict.consumed_entries, verdict.oldest_ms, verdict.size) == (1, 2000, 50)
    # Partly consumed entries stay (the next round forgets them whole).
    verdict = judge(tallied(window), 4, 0, DEFAULTS, 10_000)
    assert (verdict.consumed_entries, verdict.oldest_ms, verdict.size) == (2, 3000, 40)


def test_drop_head_drops_what_is_over_the_length_but_not_what_is_running():
    limits = Limits(max_length=5).over(DEFAULTS)
    verdict = judge(tallied(entries(4, 4)), 8, 0, limits, 10_000)
    assert (verdict.drop, verdict.drop_reason, verdict.full) == (3, "maxlen", False)
    # Two handed out already: only the six waiting can be taken.
    assert judge(tallied(entries(4, 4)), 8, 7, limits, 10_000).drop == 1


def test_max_bytes_drops_from_the_head_until_the_rest_fits():
    limits = Limits(max_length=0, max_bytes=45).over(DEFAULTS)
    verdict = judge(tallied(entries(3, 3)), 6, 0, limits, 10_000)  # 60 bytes queued
    assert (verdict.drop, verdict.drop_reason) == (2, "maxbytes")


def test_expired_copies_are_the_head_ones_older_than_the_ttl():
    limits = Limits(message_ttl=2.5).over(DEFAULTS)
    window = entries(2, 3, 1)  # queued at 1.0 s, 2.0 s, 3.0 s
    assert judge(tallied(window), 6, 0, limits, 4_000).expire == 2
    assert judge(tallied(window), 6, 0, limits, 4_600).expire == 5
    assert judge(tallied(window), 6, 0, limits, 3_400).expire == 0
    # Copies nobody tallied yet are the newest: never expired early.
    assert judge(tallied(window), 8, 0, limits, 4_600).expire == 5


def test_reject_publish_marks_full_and_drops_nothing():
    limits = Limits(max_length=5, overflow="reject-publish").over(DEFAULTS)
    at_limit = judge(tallied(entries(5)), 5, 0, limits, 10_000)
    assert (at_limit.full, at_limit.drop) == (True, 0)
    assert judge(tallied(entries(5)), 4, 0, limits, 10_000).full is False


def test_no_limits_nothing_given_up():
    verdict = judge(tallied(entries(10)), 10, 0, Limits(0, 0, 0.0, 0.0, "drop-head"), 10_000)
    assert (verdict.takes, verdict.full) == (0, False)
