"""The STOMP session without sockets: a fake transport and a fake broker."""

import types

import pytest

from gearhorn.rules.auth import Principal
from gearhorn.stomp.protocol.frames import Frame
from gearhorn.stomp.protocol.rules import SessionSettings, parse_destination
from gearhorn.stomp.protocol.sendheaders import PLAIN
from gearhorn.stomp.topics.streams import StreamDelivery
from tests.fakes import FakeBroker, FakeTransport, session_without_sockets


@pytest.fixture
def session():
    transport, broker = FakeTransport(), FakeBroker()
    s = session_without_sockets(broker.backend(), transport, SessionSettings(heartbeat_send_ms=500,
                                                   heartbeat_receive_ms=1000,
                                                   max_subscriptions=2, max_payload_bytes=100))
    return s, transport, broker


def detail(frame):
    """An ERROR's detail: its body (the message header is the common wording)."""
    return frame.body.decode()


def connect(session, **headers):
    s, transport, _ = session
    s.handle(Frame("CONNECT", {"accept-version": "1.0,1.1,1.2", **headers}))
    assert transport.frames.pop(0).command == "CONNECTED"


def last(transport):
    return transport.frames[-1]


def test_connect_negotiates_version_and_heartbeats(session):
    s, transport, _ = session
    s.handle(Frame("CONNECT", {"accept-version": "1.1,1.2", "heart-beat": "300,2000"}))
    frame = last(transport)
    assert frame.command == "CONNECTED"
    assert frame.headers["version"] == "1.2" and frame.headers["heart-beat"] == "500,1000"
    assert s.heartbeat == (2000, 1000)  # we send every max(500, 2000), expect max(300, 1000)


def test_connect_without_common_version_is_refused(session):
    s, transport, _ = session
    s.handle(Frame("CONNECT", {"accept-version": "2.0"}))
    assert last(transport).command == "ERROR"
    assert last(transport).headers["version"] == "1.0,1.1,1.2"
    assert transport.closed


@pytest.mark.parametrize("frame, reason", [
    (Frame("SEND", {"destination": "/queue/a"}), "SEND before CONNECT"),
    (Frame("CONNECT", {"accept-version": "1.2", "heart-beat": "x"}), "invalid heart-beat"),
])
def test_errors_before_connect(session, frame, reason):
    s, transport, _ = session
    s.handle(frame)
    assert reason in detail(last(transport))
    assert transport.closed and s.closed


def test_send_routes_by_destination_with_receipts(session):
    s, transport, broker = session
    connect(session)
    s.handle(Frame("SEND", {"destination": "/queue/jobs", "receipt": "1"}, b"a"))
    s.handle(Frame("SEND", {"destination": "/topic/news", "receipt": "2"}, b"b"))
    assert broker.sent == [("jobs", b"a")] and broker.published == [("news", b"b")]
    assert [(f.command, f.headers["receipt-id"]) for f in transport.frames] == [
        ("RECEIPT", "1"), ("RECEIPT", "2")]


@pytest.mark.parametrize("headers, body, reason", [
    ({"destination": "/topic/news*"}, b"", "cannot send to a wildcard topic"),
    ({"destination": "/queue/has space"}, b"", "invalid queue name"),
    ({"destination": "/elsewhere"}, b"", "unknown destination"),
    ({}, b"", "SEND needs a destination header"),
    ({"destination": "/queue/a"}, b"x" * 101, "over max_payload_bytes (100 bytes)"),
    ({"destination": "/queue/a", "transaction": "nope"}, b"", "was not begun"),
])
def test_bad_sends_get_an_error_and_nothing_is_sent(session, headers, body, reason):
    s, transport, broker = session
    connect(session)
    s.handle(Frame("SEND", {**headers, "receipt": "r"}, body))
    error = last(transport)
    assert error.command == "ERROR" and reason in detail(error)
    assert error.headers["receipt-id"] == "r"
    assert broker.sent == broker.published == []


def test_control_destinations(session):
    s, transport, _ = session
    connect(session)
    for path in ("count-msgs/queue/q", "count-subscribers/queue/q",
                 "count-subscribers/topic/t"):
        s.handle(Frame("SEND", {"destination": f"/control/{path}", "receipt": path}))
    assert [f.headers.get("num-messages", f.headers.get("num-subscribers"))
            for f in transport.frames] == ["7", "2", "3"]
    assert parse_destination("/control/count-subscribers/topic/a.*").target == "topic"


@pytest.mark.parametrize("headers, reason", [
    ({"destination": "/queue/a"}, "SUBSCRIBE needs an id header"),
    ({"destination": "/queue/a", "id": "1", "ack": "sometimes"}, "unknown ack mode"),
    ({"destination": "/queue/a", "id": "1", "prefetch-count": "0"}, "invalid prefetch"),
    ({"destination": "/queue/a", "id": "1", "ack-timeout": "-1"}, "invalid ack-timeout"),
    ({"destination": "/control/count-msgs/queue/a", "id": "1"}, "control destination"),
])
def test_bad_subscriptions(session, headers, reason):
    s, transport, _ = session
    connect(session)
    s.handle(Frame("SUBSCRIBE", headers))
    assert reason in detail(last(transport))


def test_subscription_limits_and_duplicate_ids(session):
    s, transport, _ = session
    connect(session)
    s.handle(Frame("SUBSCRIBE", {"destination": "/queue/a", "id": "1"}))
    s.handle(Frame("SUBSCRIBE", {"destination": "/queue/b", "id": "1"}))
    assert detail(last(transport)) == "A subscription identified by '1' already exists."


def test_too_many_subscriptions(session):
    s, transport, _ = session
    connect(session)
    for i in range(3):
        s.handle(Frame("SUBSCRIBE", {"destination": f"/queue/q{i}", "id": str(i)}))
    assert "more than 2 subscriptions" in detail(last(transport))


def test_client_ack_is_cumulative_and_client_individual_is_not(session):
    s, transport, broker = session
    connect(session)
    s.handle(Frame("SUBSCRIBE", {"destination": "/queue/c", "id": "c", "ack": "client",
                                 "prefetch": "10"}))
    s.handle(Frame("SUBSCRIBE", {"destination": "/queue/i", "id": "i",
                                 "ack": "client-individual", "prefetch": "10"}))
    cum, ind = broker.dispatchers["c"], broker.dispatchers["i"]
    for body in (b"1", b"2", b"3"):
        cum.push(body)
        ind.push(body)
    messages = {(f.headers["subscription"], f.body): f.headers["ack"] for f in transport.frames}
    s.handle(Frame("ACK", {"id": messages[("c", b"2")]}))
    s.handle(Frame("ACK", {"id": messages[("i", b"2")]}))
    assert cum.acked == [b"1", b"2"] and ind.acked == [b"2"]
    s.handle(Frame("NACK", {"id": messages[("i", b"3")]}))
    assert ind.given_back == [b"3"]
    s.handle(Frame("ACK", {"id": "unknown"}))  # stale ids are ignored
    assert not transport.closed
    s.connection_lost()
    assert cum.returned == [b"3"] and ind.returned == [b"1"]


def test_auto_ack_completes_only_once_written(session):
    s, transport, broker = session
    connect(session)
    s.handle(Frame("SUBSCRIBE", {"destination": "/queue/a", "id": "1"}))
    d = broker.dispatchers["a"]
    d.push(b"x")
    d.push(b"y")
    assert d.acked == []
    (sent_x, _), (_, dropped_y) = transport.callbacks[-2:]
    sent_x()
    dropped_y()
    assert d.acked == [b"x"] and d.given_back == [b"y"]


def test_only_a_stream_subscriptions_auto_ack_runs_where_its_message_is_written(session):
    """A queue's ack completes a gearmand job, and may block: the writer
    runs it. A stream's only frees credit (gearhorn/stomp/topics/streams.py)."""
    s, transport, broker = session
    connect(session)
    s.handle(Frame("SUBSCRIBE", {"destination": "/queue/a", "id": "q"}))
    broker.dispatchers["a"].push(b"x")
    s.handle(Frame("SUBSCRIBE", {"destination": "/topic/news", "id": "live"}))
    live = s.subscriptions["live"]
    credit = live.credit()
    live.deliver(StreamDelivery(live.dispatcher, b"y", {}, "m-1", b""))
    assert live.credit() == credit - 1
    assert [f.body for f in transport.frames[-2:]] == [b"x", b"y"]
    assert transport.inline[-2:] == [False, True]
    sent, _ = transport.callbacks[-1]
    sent()
    assert live.credit() == credit and live.dispatcher.settled_count == 1


def test_credit_follows_prefetch(session):
    s, transport, broker = session
    connect(session)
    s.handle(Frame("SUBSCRIBE", {"destination": "/queue/a", "id": "1", "ack": "client",
                                 "prefetch-count": "2"}))
    sub = s.subscriptions["1"]
    assert sub.credit() == 2
    broker.dispatchers["a"].push(b"1")
    assert sub.credit() == 1


def test_transactions_buffer_until_commit(session):
    s, transport, broker = session
    connect(session)
    s.handle(Frame("BEGIN", {"transaction": "t"}))
    s.handle(Frame("SEND", {"destination": "/queue/a", "transaction": "t"}, b"1"))
    s.handle(Frame("SEND", {"destination": "/queue/a", "transaction": "t"}, b"2"))
    assert broker.sent == []
    s.handle(Frame("COMMIT", {"transaction": "t", "receipt": "c"}))
    assert broker.sent == [("a", b"1"), ("a", b"2")]
    assert last(transport).headers["receipt-id"] == "c"
    s.handle(Frame("BEGIN", {"transaction": "u"}))
    s.handle(Frame("SEND", {"destination": "/queue/a", "transaction": "u"}, b"3"))
    s.handle(Frame("ABORT", {"transaction": "u"}))
    assert len(broker.sent) == 2
    s.handle(Frame("COMMIT", {"transaction": "u"}))
    assert "was not begun" in detail(last(transport))


def test_topic_subscriptions_register_and_clean_up(session):
    s, transport, broker = session
    connect(session, **{"client-id": "app"})
    s.handle(Frame("SUBSCRIBE", {"destination": "/topic/sports", "id": "n"}))
    s.handle(Frame("SUBSCRIBE", {"destination": "/topic/sports", "id": "d", "durable": "true"}))
    (_, _, temp), (_, _, durable) = broker.topics
    assert temp.startswith("s") and durable.startswith("d-")
    s.connection_lost()
    # The non-durable one is unsubscribed and its queue dropped; the durable one stays.
    assert broker.topics[2:] == [("-", "sports", temp), ("drop", f"sports_{temp}")]


def test_on_a_topic_with_history_a_plain_subscription_reads_it_live_from_next(session):
    s, transport, broker = session
    connect(session)
    s.handle(Frame("SUBSCRIBE", {"destination": "/topic/news", "id": "plain",
                                 "receipt": "r"}))
    # A live reader: no offset to resume from in its RECEIPT (nor its MESSAGEs).
    assert not any(key.startswith("x-stream") for key in transport.frames[-1].headers)
    s.handle(Frame("SUBSCRIBE", {"destination": "/topic/news*", "id": "p"}))  # a pattern
    s.handle(Frame("UNSUBSCRIBE", {"id": "p"}))
    s.handle(Frame("SUBSCRIBE", {"destination": "/topic/news", "id": "d", "durable": "true"}))
    assert broker.streams == [("news", 9, "e1", True, True)]  # past the last: only new ones
    assert [entry[2][0] for entry in broker.topics if entry[0] == "+"] == ["+", "s", "d"]


@pytest.mark.parametrize("offset, epoch, start", [
    ("first", None, (2, "true")), ("next", None, (9, "true")), ("last", None, (8, "true")),
    ("5", "e1", (4, "true")), ("offset=10", None, (9, "true")),
    ("timestamp=1700000000", None, (4, "true")),
    ("2", None, (2, "false")),  # trimmed: from the oldest kept, and said so
    ("11", None, (2, "false")),  # ahead of the last offset given
    ("5", "e0", (2, "false")),  # another epoch
])
def test_a_stream_subscription_starts_where_x_stream_offset_says(session, offset, epoch,
                                                                 start):
    s, transport, broker = session
    connect(session)
    headers = {"destination": "/topic/news", "id": "n", "receipt": "r",
               "x-stream-offset": offset, **({"x-stream-epoch": epoch} if epoch else {})}
    s.handle(Frame("SUBSCRIBE", headers))
    receipt = last(transport)
    assert receipt.command == "RECEIPT"
    assert (receipt.headers["x-stream-offset"], receipt.headers["x-recovered"]) == (
        str(start[0] + 1), start[1])
    assert broker.streams == [("news", start[0], "e1", start[1] == "true", False)]
    ((_, topic, client_id),) = broker.topics
    assert topic == "news" and client_id.startswith("+")
    s.connection_lost()  # listed for presence, and no queue to drop
    assert broker.topics[1:] == [("-", "news", client_id)]


@pytest.mark.parametrize("destination, offset, reason", [
    ("/topic/news", "soon", "invalid x-stream-offset"),
    ("/topic/news", "0", "invalid x-stream-offset"),
    ("/topic/news", "timestamp=-1", "invalid x-stream-offset"),
    ("/topic/news*", "first", "needs one topic"),
    ("/topic/sports", "first", "keeps no history"),
])
def test_bad_stream_subscriptions_are_refused(session, destination, offset, reason):
    s, transport, broker = session
    connect(session)
    s.handle(Frame("SUBSCRIBE", {"destination": destination, "id": "n",
                                 "x-stream-offset": offset}))
    assert last(transport).command == "ERROR" and reason in detail(last(transport))
    assert broker.topics == [] and not hasattr(broker, "streams")


def test_consecutive_sends_to_one_destination_are_one_batch(session):
    s, transport, broker = session
    connect(session)
    frames = [Frame("SEND", {"destination": "/topic/t", "receipt": str(i)}, str(i).encode())
              for i in range(5)]
    frames.insert(3, Frame("SEND", {"destination": "/queue/q", "receipt": "q"}, b"q"))
    s.handle_frames(frames)
    assert broker.published == [("t", b"0"), ("t", b"1"), ("t", b"2"), ("t", b"3"),
                                ("t", b"4")]
    assert broker.sent == [("q", b"q")]
    assert broker.calls == 3  # [0,1,2], [q], [3,4]
    assert [f.headers["receipt-id"] for f in transport.frames] == ["0", "1", "2", "q", "3", "4"]


def test_a_bad_frame_in_a_batch_stops_after_the_good_ones(session):
    s, transport, broker = session
    connect(session)
    frames = [Frame("SEND", {"destination": "/queue/q"}, b"1"),
              Frame("SEND", {"destination": "/queue/q"}, b"2"),
              Frame("SEND", {"destination": "/queue/bad name"}, b"3"),
              Frame("SEND", {"destination": "/queue/q"}, b"4")]
    s.handle_frames(frames)
    assert broker.sent == [("q", b"1"), ("q", b"2")]
    assert "invalid queue name" in detail(last(transport))


def test_sender_headers_reach_the_consumer_with_a_delivery_count(session):
    s, transport, broker = session
    connect(session)
    s.handle(Frame("SUBSCRIBE", {"destination": "/queue/a", "id": "1", "ack": "client"}))
    broker.dispatchers["a"].push(b"x", headers={"correlation-id": "c1", "x-team": "ops",
                                               "content-type": "text/plain"}, deliveries=3)
    message = last(transport)
    assert message.command == "MESSAGE" and message.body == b"x"
    assert {k: message.headers[k] for k in ("correlation-id", "x-team", "content-type",
                                           "delivery-count", "destination", "subscription")} \
        == {"correlation-id": "c1", "x-team": "ops", "content-type": "text/plain",
            "delivery-count": "3", "destination": "/queue/a", "subscription": "1"}


def test_send_options_go_to_the_broker_and_keep_sends_out_of_batches(session):
    s, transport, broker = session
    connect(session)
    s.handle_frames([Frame("SEND", {"destination": "/queue/q", "priority": "9"}, b"1"),
                     Frame("SEND", {"destination": "/queue/q", "x-delay": "500"}, b"2"),
                     Frame("SEND", {"destination": "/topic/t", "x-k": "v"}, b"3"),
                     Frame("SEND", {"destination": "/queue/q"}, b"4")])
    assert broker.calls == 4
    assert [(o.priority, o.delay, o.headers) for o in broker.options] == [
        ("high", None, {"priority": "9"}), ("normal", 0.5, {}), ("normal", None, {"x-k": "v"}),
        ("normal", None, {})]


def test_persistent_sends_as_rabbitmq_clients_make_them_travel_in_one_batch(session):
    s, transport, broker = session
    connect(session)
    s.handle_frames([Frame("SEND", {"destination": "/topic/t", "persistent": "true",
                                    "receipt": f"r{i}"}, str(i).encode()) for i in range(3)])
    assert broker.calls == 1 and broker.options == [PLAIN]
    assert broker.published == [("t", b"0"), ("t", b"1"), ("t", b"2")]
    assert [f.headers["receipt-id"] for f in transport.frames] == ["r0", "r1", "r2"]


def test_reply_to_a_temp_queue_makes_a_private_queue_and_a_request(session):
    s, transport, broker = session
    connect(session)
    s.handle(Frame("SEND", {"destination": "/queue/svc", "reply-to": "/temp-queue/r",
                            "correlation-id": "42", "receipt": "1"}, b"ping"))
    (function, body, options, reply_queue), = broker.requests
    assert (function, body) == ("svc", b"ping")
    assert reply_queue == f"gearhorn.tmp.{s.id}.r" and reply_queue in broker.dispatchers
    assert options.headers == {"reply-to": f"/queue/{reply_queue}", "correlation-id": "42"}
    assert s.subscriptions["/temp-queue/r"].ack == "auto"
    assert last(transport).headers["receipt-id"] == "1"
    # the reply arrives on the implicit subscription
    broker.dispatchers[reply_queue].push(b"pong", headers={"correlation-id": "42"})
    reply = last(transport)
    assert reply.headers["subscription"] == "/temp-queue/r" and reply.body == b"pong"
    # reused, private to this connection, and dropped with it
    s.handle(Frame("SEND", {"destination": "/topic/t", "reply-to": "/temp-queue/r"}, b"x"))
    assert len(broker.dispatchers) == 1
    s.handle(Frame("SUBSCRIBE", {"destination": f"/queue/{reply_queue}", "id": "spy"}))
    assert "belongs to the connection that made it" in detail(last(transport))
    s.connection_lost()
    assert ("drop", reply_queue) in broker.topics


def test_a_refused_login_gets_an_error_without_the_passcode(session):
    s, transport, _ = session
    s.handle(Frame("CONNECT", {"accept-version": "1.2", "login": "alice",
                               "passcode": "Wr0ngPass", "receipt": "r"}))
    error = last(transport)
    assert error.command == "ERROR" and detail(error) == "Access refused for user 'alice'"
    assert b"Wr0ngPass" not in error.body and "Wr0ngPass" not in str(error.headers)
    assert transport.closed


@pytest.mark.parametrize("frame, refusal", [
    (Frame("SEND", {"destination": "/queue/secret"}, b"x"),
     "access refused: alice may not send to /queue/secret"),
    (Frame("SEND", {"destination": "/topic/news"}, b"x"),
     "access refused: alice may not send to /topic/news"),
    (Frame("SUBSCRIBE", {"destination": "/topic/*", "id": "1"}),
     "access refused: alice may not subscribe to /topic/*"),
    (Frame("SUBSCRIBE", {"destination": "/queue/secret", "id": "1"}),
     "access refused: alice may not subscribe to /queue/secret"),
    (Frame("SEND", {"destination": "/control/count-msgs/queue/secret"}, b""),
     "access refused: alice may not read /queue/secret"),
])
def test_what_a_principal_may_not_do_is_refused_and_nothing_happens(session, frame, refusal):
    s, transport, broker = session
    broker.principal = Principal("alice", read=("/topic/news", "/queue/jobs"),
                                 write=("/queue/jobs",))
    connect(session, login="alice", passcode="right")
    s.handle(frame)
    assert detail(last(transport)) == refusal and transport.closed
    assert broker.sent == broker.published == [] and broker.dispatchers == {}


def test_a_batch_of_sends_is_checked_too(session):
    s, transport, broker = session
    broker.principal = Principal("alice", write=("/queue/jobs",))
    connect(session, login="alice", passcode="right")
    s.handle_frames([Frame("SEND", {"destination": "/queue/other"}, b"1"),
                     Frame("SEND", {"destination": "/queue/other"}, b"2")])
    assert "may not send to /queue/other" in detail(last(transport))
    assert broker.sent == []


def test_allowed_frames_pass(session):
    s, transport, broker = session
    broker.principal = Principal("alice", read=("/topic/news",), write=("/queue/jobs",))
    connect(session, login="alice", passcode="right")
    s.handle(Frame("SEND", {"destination": "/queue/jobs"}, b"1"))
    s.handle(Frame("SUBSCRIBE", {"destination": "/topic/news", "id": "n"}))
    assert broker.sent == [("jobs", b"1")] and not transport.closed


def test_requests_waiting_for_replies_are_limited_per_connection():
    transport, broker = FakeTransport(), FakeBroker()
    s = session_without_sockets(broker.backend(), transport,
                SessionSettings(max_pending_requests=2, max_payload_bytes=100))
    s.handle(Frame("CONNECT", {"accept-version": "1.2"}))
    send = Frame("SEND", {"destination": "/queue/svc", "reply-to": "/temp-queue/r"}, b"?")
    s.handle(send)
    s.handle(send)
    broker.done[0]()  # one answered
    s.handle(send)
    assert len(broker.requests) == 3 and not transport.closed
    s.handle(send)
    assert detail(last(transport)) == \
        "more than 2 requests waiting for their reply on one connection"


def test_a_reply_goes_only_to_a_live_temp_queue(session):
    s, transport, broker = session
    connect(session)
    s.handle(Frame("SEND", {"destination": "/queue/svc", "reply-to": "/temp-queue/r"}, b"?"))
    reply_queue = broker.requests[0][3]
    s.handle(Frame("SEND", {"destination": f"/queue/{reply_queue}"}, b"answer"))
    assert broker.sent == [(reply_queue, b"answer")]
    s.handle(Frame("SEND", {"destination": "/queue/gearhorn.tmp.made-up"}, b"junk"))
    assert "no temporary queue 'gearhorn.tmp.made-up'" in detail(last(transport))
    assert broker.sent == [(reply_queue, b"answer")]


@pytest.mark.parametrize("requeue, given_back", [("False", False), ("FALSE", False),
                                                 ("false", False), ("True", True),
                                                 ("true", True), (None, True)])
def test_nack_requeue_is_true_or_false_in_any_case(session, requeue, given_back):
    s, transport, broker = session
    connect(session)
    s.handle(Frame("SUBSCRIBE", {"destination": "/queue/jobs", "id": "1",
                                 "ack": "client-individual"}))
    dispatcher = broker.dispatchers["jobs"]
    dispatcher.push(b"m")
    ack = last(transport).headers["ack"]
    s.handle(Frame("NACK", {"id": ack, **({} if requeue is None else {"requeue": requeue})}))
    assert (dispatcher.given_back, dispatcher.rejected) == \
        (([b"m"], []) if given_back else ([], [b"m"]))


def test_a_requeue_that_is_not_a_boolean_is_an_invalid_header(session):
    s, transport, broker = session
    connect(session)
    s.handle(Frame("SUBSCRIBE", {"destination": "/queue/jobs", "id": "1",
                                 "ack": "client-individual"}))
    broker.dispatchers["jobs"].push(b"m")
    s.handle(Frame("NACK", {"id": last(transport).headers["ack"], "requeue": "no"}))
    error = last(transport)
    assert error.headers["message"] == "Invalid header" and transport.closed
    assert "invalid requeue header 'no': true or false" in detail(error)
    assert broker.dispatchers["jobs"].given_back == broker.dispatchers["jobs"].rejected == []


@pytest.mark.parametrize("durable", ["true", "True", "TRUE"])
def test_durable_is_read_in_any_case(session, durable):
    s, transport, broker = session
    connect(session)
    s.handle(Frame("SUBSCRIBE", {"destination": "/topic/news", "id": "n",
                                 "durable": durable}))
    assert s.subscriptions["n"].durable and not transport.closed


def test_topic_sends_go_on_while_a_fanout_runs_and_other_frames_wait_for_it():
    """Under gevent, with fanout jobs that answer when the test says: the
    session reads SENDs on while the first job runs (they leave as the next
    job), and a SUBSCRIBE waits until both are answered, so its RECEIPT
    comes after theirs."""
    import gevent
    import gevent.event

    from gearhorn.stomp.sessions.session import Session

    transport, broker = FakeTransport(), FakeBroker()
    answers = []

    def start(client, send):
        broker.published += [(send.topic, body) for body in send.bodies]
        answers.append(gevent.event.AsyncResult())
        return types.SimpleNamespace(wait=answers[-1].get)

    broker.start = start
    s = Session(broker.backend(), transport, SessionSettings())
    s.handle(Frame("CONNECT", {"accept-version": "1.2"}))
    for body in (b"1", b"2", b"3"):
        s.handle(Frame("SEND", {"destination": "/topic/news", "receipt": body.decode()}, body))
        gevent.sleep(0)
    subscribing = gevent.spawn(s.handle, Frame("SUBSCRIBE", {
        "destination": "/queue/jobs", "id": "q", "receipt": "sub"}))
    gevent.sleep(0.01)
    assert broker.published == [("news", b"1")] and not subscribing.ready()
    answers[0].set({})
    gevent.sleep(0.01)
    assert broker.published[1:] == [("news", b"2"), ("news", b"3")]  # one job for both
    assert len(answers) == 2 and not subscribing.ready()
    answers[1].set({})
    subscribing.join(5)
    assert [f.headers.get("receipt-id") for f in transport.frames[1:]] == ["1", "2", "3", "sub"]


def test_no_receipt_follows_the_error_of_a_failed_fanout():
    """A SEND read while a topic SEND's job runs waits for it; when that job
    fails, the connection ends with the ERROR: the waiting SEND is not sent
    and gets no RECEIPT (one after an ERROR would say it was taken)."""
    import gevent
    import gevent.event

    from gearhorn.stomp.queues.publisher import FanoutFailed
    from gearhorn.stomp.sessions.session import Session

    transport, broker = FakeTransport(), FakeBroker()
    answers = []

    def start(client, send):
        answers.append(gevent.event.AsyncResult())
        return types.SimpleNamespace(wait=answers[-1].get)

    broker.start = start
    s = Session(broker.backend(), transport, SessionSettings())
    s.handle(Frame("CONNECT", {"accept-version": "1.2"}))
    s.handle(Frame("SEND", {"destination": "/topic/news", "receipt": "t"}, b"1"))
    sending = gevent.spawn(s.handle, Frame("SEND", {"destination": "/queue/jobs",
                                                    "receipt": "q"}, b"2"))
    gevent.sleep(0.01)
    assert len(answers) == 1 and not sending.ready()
    answers[0].set_exception(FanoutFailed("fanout to news failed: timeout"))
    sending.join(5)
    assert [(f.command, f.headers.get("receipt-id")) for f in transport.frames[1:]] == [
        ("ERROR", "t")]
    assert broker.sent == [] and transport.closed


def test_a_receipt_comes_only_after_the_disk_wait_covering_its_send(session):
    """Each receipted SEND is handed to gearmand, then waited on (the fsync
    barrier), then answered: the wait saw the SEND's body handed over and
    no RECEIPT of it written yet. A SEND without a receipt waits for nothing,
    and a topic SEND's RECEIPT waits for its fanout job's answer instead
    (the worker answers after the fsync covering it)."""
    s, transport, broker = session
    connect(session)
    broker.frames = transport.frames
    s.handle(Frame("SEND", {"destination": "/queue/jobs"}, b"no receipt"))
    assert getattr(broker, "disk_waits", 0) == 0
    s.handle(Frame("SEND", {"destination": "/queue/jobs", "receipt": "q"}, b"a"))
    s.handle(Frame("SEND", {"destination": "/topic/news", "receipt": "t"}, b"b"))
    receipts = [f.headers["receipt-id"] for f in transport.frames]
    assert receipts == ["q", "t"]
    # (bodies handed over, frames written) at the wait: the queue SEND's
    # body was out and its RECEIPT not yet written.
    assert broker.disk_log == [(2, 0)]


def test_a_failed_disk_wait_is_an_error_and_no_receipt(session):
    from gearhorn.store.fsync import FsyncFailed

    s, transport, broker = session
    connect(session)
    broker.disk_fails = FsyncFailed("fsync of the registry's Redis failed: Input/output error")
    s.handle(Frame("SEND", {"destination": "/queue/jobs", "receipt": "q"}, b"a"))
    (error,) = transport.frames
    assert error.command == "ERROR" and error.headers["receipt-id"] == "q"
    assert "Input/output error" in error.headers["message"] + detail(error)
    assert broker.disk_waits == 1
