import json

import pytest

from gearhorn.rules import messages as m
from gearhorn.rules import naming


@pytest.mark.parametrize("topic", ["news", "a", "news.sports_eu", "x" * 128, "!~"])
def test_valid_topics(topic):
    assert m.validate_topic(topic) == topic


@pytest.mark.parametrize("topic, reason", [
    ("", "invalid topic"),
    ("x" * 129, "invalid topic"),
    ("has space", "invalid topic"),
    ("tab\there", "invalid topic"),
    ("caf\u00e9", "invalid topic"),
    ("nul\0", "invalid topic"),
    ("news*", "'*' is allowed in a topic"),
    (5, "topic must be a string, not a number"),
    (None, "topic must be a string, not null"),
    (["a"], "topic must be a string, not an array"),
])
def test_invalid_topics(topic, reason):
    with pytest.raises(m.BadRequest, match=reason.replace("*", r"\*")):
        m.validate_topic(topic)


def test_prefix_wildcard_only_at_the_end_of_a_subscription():
    assert m.validate_topic("news.*", allow_prefix=True) == "news.*"
    assert m.validate_topic("*", allow_prefix=True) == "*"
    with pytest.raises(m.BadRequest, match="last character"):
        m.validate_topic("ne*ws", allow_prefix=True)


@pytest.mark.parametrize("client_id, reason", [
    ("with_underscore", "'_' is not allowed"),
    ("", "invalid client_id"),
    ("a b", "invalid client_id"),
    (7, "client_id must be a string"),
])
def test_invalid_client_ids(client_id, reason):
    with pytest.raises(m.BadRequest, match=reason):
        m.validate_client_id(client_id)


def test_queue_name_splits_at_the_last_underscore():
    name = naming.queue_name("news_eu", "alice")
    assert name == "news_eu_alice"
    assert naming.split_queue_name(name) == ("news_eu", "alice")
    with pytest.raises(m.BadRequest):
        naming.split_queue_name("nounderscore")


def test_parse_subscription():
    sub = m.parse_subscription(b'{"topic": "news", "client_id": "alice"}')
    assert sub == m.Subscription("news", "alice")
    assert not sub.is_prefix
    assert m.parse_subscription(b'{"topic": "news.*", "client_id": "a"}').is_prefix


@pytest.mark.parametrize("data, reason", [
    (b"not json", "job is not JSON"),
    (b"", "job is not JSON"),
    (b"\xff\xfe", "job is not UTF-8"),
    (b"[1, 2]", "job must be a JSON object, not an array"),
    (b'"text"', "job must be a JSON object, not a string"),
    (b'{"client_id": "a"}', "missing key 'topic'"),
    (b'{"topic": "t"}', "missing key 'client_id'"),
    (b'{"topic": 1, "client_id": "a"}', "topic must be a string"),
    (b'{"topic": "t", "client_id": "a_b"}', "'_' is not allowed"),
    (b"[" * 100000 + b"]" * 100000, "job is"),
])
def test_parse_subscription_rejects(data, reason):
    with pytest.raises(m.BadRequest, match=reason):
        m.parse_subscription(data)


def test_parse_fanout_payload_encoding():
    text = m.parse_fanout(json.dumps({"topic": "t", "payload": "h\u00e9llo"}).encode())
    assert text.data == "h\u00e9llo".encode()
    obj = m.parse_fanout(b'{"topic": "t", "payload": {"a": [1, 2]}}')
    assert obj.data == b'{"a":[1,2]}'
    assert m.parse_fanout(b'{"topic": "t", "payload": null}').data == b"null"
    assert m.parse_fanout(b'{"topic": "t", "payload": 3}').data == b"3"


def test_parse_fanout_options():
    req = m.parse_fanout(b'{"topic": "t", "payload": "", "unique": "u1", "background": 1}')
    assert (req.unique, req.background) == ("u1", True)
    req = m.parse_fanout(b'{"topic": "t", "payload": "x", "background": false}')
    assert (req.unique, req.background) == (None, False)


def test_message_ids_named_by_the_sender_are_kept_else_derived_from_the_job():
    named = m.parse_fanout(b'{"topic": "t", "payloads": ["x", "y"], "message_ids": ["a", "b"]}')
    assert named.ids("call:1") == ["a", "b"]
    derived = m.parse_fanout(b'{"topic": "t", "payloads": ["x", "y"]}')
    assert derived.ids("call:1") == m.message_ids_for("call:1", 2)


@pytest.mark.parametrize("data, reason", [
    (b'{"topic": "t"}', "missing key 'payload'"),
    (b'{"payload": "x"}', "missing key 'topic'"),
    (b'{"topic": "a*", "payload": "x"}', "invalid topic"),
    (b'{"topic": "t", "payload": "x", "unique": 5}', "unique must be a string"),
    (b'{"topic": "t", "payload": "x", "unique": "' + b"u" * 65 + b'"}', "invalid unique"),
    (b'{"topic": "t", "payload": "x", "unique": "a b"}', "invalid unique"),
    (b'{"topic": "t", "payload": ' + b"[" * 50000 + b"]" * 50000 + b"}", "nested too deeply"),
    (b'{"topic": "t", "payload": "\xc3\x28"}', "job is not UTF-8"),
    (b'{"topic": "t", "payloads": ["x", "y"], "message_ids": ["a"]}',
     "message_ids must be a list of 2 ids"),
    (b'{"topic": "t", "payload": "x", "message_ids": "a"}', "message_ids must be a list"),
    (b'{"topic": "t", "payload": "x", "message_ids": [7]}', "invalid message id '7'"),
    (b'{"topic": "t", "payload": "x", "message_ids": ["a b"]}', "invalid message id"),
    (b'{"topic": "t", "payload": "x", "message_ids": ["@h:c"]}', "invalid message id"),
])
def test_parse_fanout_rejects(data, reason):
    with pytest.raises(m.BadRequest, match=reason):
        m.parse_fanout(data)


def test_payload_limit_counts_the_bytes_sent():
    at_limit = json.dumps({"topic": "t", "payload": "x" * 100}).encode()
    assert len(m.parse_fanout(at_limit, max_payload=100).data) == 100
    over = json.dumps({"topic": "t", "payload": "x" * 101}).encode()
    with pytest.raises(m.BadRequest,
                       match=r"payload is 101 bytes, over max_payload_bytes \(100 bytes\)"):
        m.parse_fanout(over, max_payload=100)


def test_huge_job_is_refused_before_parsing():
    huge = b'{"topic": "t", "payload": "' + b"x" * 20000 + b'"}'
    limit = r"job is .* bytes: payloads are limited to max_payload_bytes \(1000 bytes\)"
    with pytest.raises(m.BadRequest, match=limit):
        m.parse_fanout(huge, max_payload=1000)


def test_copy_unique_stays_within_gearmand_limit_and_is_deterministic():
    assert naming.copy_unique("msg1", "alice") == "msg1:alice"
    # 63 bytes pass as they are; 64 would come back from gearmand corrupted
    assert naming.copy_unique("m" * 32, "c" * 30) == "m" * 32 + ":" + "c" * 30
    assert len(naming.copy_unique("m" * 32, "c" * 31)) == 62
    assert len(naming.copy_unique("m" * 32, "c" * 31, "ab" * 16)) == 63
    long = naming.copy_unique("m" * 32, "c" * 128)
    assert len(long) <= m.MAX_UNIQUE_BYTES
    assert long == naming.copy_unique("m" * 32, "c" * 128)
    assert long != naming.copy_unique("m" * 32, "c" * 127 + "d")


def test_message_ids_are_unique():
    assert len({naming.new_message_id() for _ in range(1000)}) == 1000


def test_base64_and_batched_payloads():
    assert m.parse_fanout(b'{"topic": "t", "payload_base64": "AP8A"}').data == b"\x00\xff\x00"
    req = m.parse_fanout(b'{"topic": "t", "payloads": ["a", {"b": 1}]}')
    assert req.bodies == (b"a", b'{"b":1}')
    req = m.parse_fanout(b'{"topic": "t", "payloads_base64": ["AA==", "/w=="]}')
    assert req.bodies == (b"\x00", b"\xff")


@pytest.mark.parametrize("data, limit, reason", [
    (b'{"topic": "t", "payload": "x", "payload_base64": "AA=="}', 100,
     "not payload and payload_base64"),
    (b'{"topic": "t", "payload_base64": "***"}', 100, "not valid base64"),
    (b'{"topic": "t", "payload_base64": 1}', 100, "must hold strings"),
    (b'{"topic": "t", "payloads": []}', 100, "list of 1 to 1000"),
    (b'{"topic": "t", "payloads": "x"}', 100, "list of 1 to 1000"),
    (b'{"topic": "t", "payloads": ["a", "b"], "unique": "u"}', 100,
     "unique applies to one message"),
    (b'{"topic": "t", "payloads": ["aaaa", "bbbb"]}', 7,
     r"2 payloads total 8 bytes, over max_payload_bytes \(7 bytes\)"),
])
def test_bad_base64_and_batched_payloads(data, limit, reason):
    with pytest.raises(m.BadRequest, match=reason):
        m.parse_fanout(data, max_payload=limit)


def _fanout(**job):
    return m.parse_fanout(json.dumps({"topic": "t", "payload": "p", **job}).encode(), now=1000.0)


def test_priority_delay_and_headers():
    assert _fanout().priority == "normal" and _fanout().deliver_at is None
    assert _fanout(priority="high").priority == "high"
    assert _fanout(delay=2.5).deliver_at == 1002.5
    assert _fanout(deliver_at=1500).deliver_at == 1500.0
    assert _fanout(deliver_at="1970-01-01T00:25:00Z").deliver_at == 1500.0
    assert _fanout(deliver_at="1970-01-01T01:25:00+01:00").deliver_at == 1500.0
    assert _fanout(deliver_at=10).deliver_at is None  # in the past: now
    assert _fanout(headers={"reply-to": "/queue/r", "x-n": "1"}).headers == {
        "reply-to": "/queue/r", "x-n": "1"}


@pytest.mark.parametrize("job, reason", [
    ({"priority": "urgent"}, "invalid priority 'urgent': use high, normal or low"),
    ({"priority": 1}, "invalid priority '1'"),
    ({"delay": -1}, "delay must be a number of seconds (0 or more)"),
    ({"delay": "5"}, "delay must be a number of seconds"),
    ({"delay": True}, "delay must be a number of seconds"),
    ({"delay": 1, "deliver_at": 2000}, "give deliver_at or delay, not both"),
    ({"delay": 400 * 86400}, "delivery is more than 366 days ahead"),
    ({"deliver_at": "tomorrow"}, "invalid deliver_at 'tomorrow': use epoch seconds or RFC 3339"),
    ({"deliver_at": "2026-11-22T21:00:00"}, "with a time zone"),
    ({"headers": ["a"]}, "headers must be an object, not an array"),
    ({"headers": {"": "x"}}, "invalid header name '': 1 to 128 characters without NUL"),
    ({"headers": {"a\u0000b": "x"}}, "invalid header name"),
    ({"headers": {"h" * 129: "x"}}, "invalid header name"),
    ({"headers": {"a": 1}}, "header 'a' must be a string without NUL"),
    ({"headers": {"content-length": "1"}}, "header 'content-length' is set by the bridge"),
    ({"headers": {"a": "x\u0000y"}}, "header 'a' must be a string without NUL"),
    ({"headers": {f"h{i}": "" for i in range(65)}}, "more than 64 headers"),
    ({"headers": {"a": "x" * 9000}}, "headers are 9001 bytes, over the limit of 8192"),
])
def test_bad_priority_delay_and_headers(job, reason):
    with pytest.raises(m.BadRequest) as exc:
        _fanout(**job)
    assert reason in str(exc.value)


def test_header_ids_travel_in_unique_keys_within_gearmand_limit():
    hid = naming.header_id_for("ab" * 16, None)
    assert hid == "ab" * 16
    for who in ("alice", "news.*:" + "x" * 128):
        key = naming.copy_unique("ignored", who, hid)
        assert len(key) <= 64 and naming.header_id_of(key) == hid
        assert key == naming.copy_unique("ignored", who, hid)
    # A producer's unique gives the same header id each time (a retry coalesces).
    assert naming.header_id_for("m1", "order-7") == naming.header_id_for("m2", "order-7") != "m1"
    assert naming.header_id_of("plain:alice") is None and naming.header_id_of("@short") is None


def test_a_foreground_copy_is_marked_and_keeps_its_header_id_and_length():
    plain = naming.copy_unique("msg1", "alice", foreground=True)
    assert plain == "!msg1:alice"
    hid = "ab" * 16
    marked = naming.copy_unique("x", "c" * 100, hid, foreground=True)
    assert marked.startswith("!@") and len(marked) <= m.MAX_UNIQUE_BYTES
    assert naming.header_id_of(marked) == hid
    long = naming.copy_unique("m" * 32, "c" * 128, foreground=True)
    assert long.startswith("!h:") and len(long) == 63
    assert long[1:] == naming.copy_unique("m" * 32, "c" * 128)  # same digest, marked


@pytest.mark.parametrize("function, unique, expected", [
    ("news_alice", "m1:alice", True),  # a background fanout's copy
    ("news.*_bob", "m1:news.*:bob", True),  # a prefix subscriber's copy
    ("news_alice", "h:" + "0" * 60, True),
    ("news_alice", "@" + "ab" * 16 + ":alice", True),
    ("jobs", "stomp:ab12", True),
    ("jobs", "delayed:ab12", True),
    ("jobs", "~" + "cd" * 16, True),  # given back once already
    ("news_alice", "!m1:alice", False),  # a foreground fanout's copy
    ("news_alice", "!@" + "ab" * 16 + ":alice", False),
    ("jobs", "order-17", False),  # another client's job: perhaps foreground
    ("news_alice", "m1:bob", False),
    ("jobs", "call:ab12", False),
    ("jobs", "", False),
])
def test_only_background_jobs_gearhorn_made_may_be_given_back(function, unique, expected):
    from gearhorn.rules.naming import returnable

    assert returnable(function, unique) is expected


@pytest.mark.parametrize("bodies, options", [
    ([b"hello"], {}),
    ([b"\xff\x00binary"], {"priority": "high", "headers": {"k": "v"}}),
    ([b"a", b"b", b"c"], {"message_ids": ["1" * 32, "2" * 32, "3" * 32]}),
    ([b"x", b"\xfe"], {"delay": 30.0, "background": False}),
    ([b"once"], {"unique": "order-7", "dedup_id": "d-1", "deliver_at": 5_000.0}),
])
def test_the_one_fanout_job_encoder_is_read_back_as_it_was_meant(bodies, options):
    """What the bridge, the Python client and presence events send is what
    the worker reads (messages.fanout_job is the format's one writer)."""
    request = m.parse_fanout(m.fanout_job("news", bodies, **options), now=1_000.0)
    assert request.topic == "news" and list(request.bodies) == bodies
    assert request.background is options.get("background", True)
    assert request.priority == options.get("priority", "normal")
    assert request.headers == options.get("headers", {})
    assert (request.unique, request.dedup_id) == (options.get("unique"), options.get("dedup_id"))
    assert request.in_history is ("message_ids" in options)
    if "message_ids" in options:
        assert request.message_ids == tuple(options["message_ids"])
    due = options.get("deliver_at") or (1_000.0 + options["delay"] if "delay" in options
                                        else None)
    assert request.deliver_at == due
