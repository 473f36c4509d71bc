"""The corners of STOMP 1.0/1.1/1.2 that other clients and brokers rely on,
on a real bridge, gearmand, Redis and worker pool (docs/stomp.rst lists each
clause with its test)."""

import pytest

from .helpers import queue_depth, unique_topic, wait_for
from .stomp_helpers import RawClient, error_detail

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def stack(gearmand, start_pool, start_bridge):
    start_pool([gearmand], processes=1)
    return start_bridge([gearmand])


@pytest.fixture
def raw_clients(stack):
    clients = []

    def make(version="1.2", connect=True, **headers):
        client = RawClient(stack.port, version)
        clients.append(client)
        if connect:
            client.connect(**headers)
        return client

    yield make
    for client in clients:
        client.close()


def subscribe(client, destination, sub_id, **headers):
    client.frame("SUBSCRIBE", {"destination": destination, "id": sub_id, "receipt": "sub",
                               **headers})
    assert client.expect("RECEIPT").headers["receipt-id"] == "sub"


def send(client, destination, body, **headers):
    client.frame("SEND", {"destination": destination, "receipt": "sent", **headers}, body)
    assert client.expect("RECEIPT").headers["receipt-id"] == "sent"


def closed(client):
    """The bridge closed the connection (after its ERROR)."""
    return client.read_frame() is None


# -- headers ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_header_names_with_escapes_travel_and_are_escaped_again(kind, raw_clients):
    destination = f"/{kind}/{unique_topic()}"
    consumer, producer = raw_clients(), raw_clients()
    subscribe(consumer, destination, "s")
    producer.send(b"SEND\ndestination:" + destination.encode() +
                  b"\nkey\\cone:v\\c1\\nnext\nna\xc3\xafve:\xc3\xbc\nreceipt:sent\n\nbody\0")
    assert producer.expect("RECEIPT").headers["receipt-id"] == "sent"
    message = consumer.expect("MESSAGE")
    assert message.headers["key:one"] == "v:1\nnext"
    assert message.headers["naïve"] == "ü"
    assert message.body == b"body"


def test_header_names_are_escaped_on_the_wire(raw_clients):
    queue = f"/queue/{unique_topic()}"
    consumer, producer = raw_clients(), raw_clients()
    send(producer, queue, b"x", **{"key:one": "a\\b"})
    consumer.frame("SUBSCRIBE", {"destination": queue, "id": "s"})
    data = b""
    while b"\0" not in data:
        data += consumer.sock.recv(65536)
    assert b"\nkey\\cone:a\\\\b\n" in data


def test_1_0_leaves_out_what_it_cannot_write(raw_clients):
    queue = f"/queue/{unique_topic()}"
    producer, consumer = raw_clients(), raw_clients("1.0")
    send(producer, queue, b"x", **{"key:one": "1", "plain": "2"})
    subscribe(consumer, queue, "s")
    message = consumer.expect("MESSAGE")
    assert message.headers["plain"] == "2" and "key" not in message.headers


# -- CONNECT ------------------------------------------------------------------------


def test_no_version_in_common_gets_the_list_of_versions(raw_clients):
    client = raw_clients(connect=False)
    client.frame("CONNECT", {"accept-version": "2.0,2.1", "host": "x"})
    error = client.expect("ERROR")
    assert error.headers["version"] == "1.0,1.1,1.2"
    assert error.body == b"Supported versions are 1.0,1.1,1.2\n"  # RabbitMQ's words
    assert closed(client)


# -- ACK and NACK ---------------------------------------------------------------------


def test_ack_without_id_in_1_2_is_an_error(raw_clients):
    queue = f"/queue/{unique_topic()}"
    client = raw_clients()
    send(client, queue, b"m")
    subscribe(client, queue, "s", ack="client")
    message = client.expect("MESSAGE")
    # message-id is what 1.1 uses; 1.2 needs id (the MESSAGE's ack header).
    client.frame("ACK", {"message-id": message.headers["message-id"], "receipt": "a"})
    error = client.expect("ERROR")
    assert error.headers["receipt-id"] == "a"
    assert "ACK needs an id header" in error_detail(error)
    assert error.headers["message"] == "Missing header"
    assert closed(client)


def test_nack_without_id_in_1_2_is_an_error(raw_clients):
    client = raw_clients()
    client.frame("NACK", {"subscription": "s"})
    assert "NACK needs an id header" in error_detail(client.expect("ERROR"))


def test_nack_works_on_stomp_1_0(raw_clients):
    queue = f"/queue/{unique_topic()}"
    client = raw_clients("1.0")
    send(client, queue, b"m")
    subscribe(client, queue, "s", ack="client")
    first = client.expect("MESSAGE")
    assert first.headers["redelivered"] == "false"
    client.frame("NACK", {"message-id": first.headers["message-id"], "receipt": "n"})
    frames = {f.command: f for f in (client.read_frame(), client.read_frame())}
    assert frames["RECEIPT"].headers["receipt-id"] == "n"
    again = frames["MESSAGE"]
    assert again.body == b"m" and again.headers["redelivered"] == "true"


def test_nack_without_requeue_goes_to_the_dead_letter_queue(raw_clients, gearmand):
    name = unique_topic("q")
    client = raw_clients()
    send(client, f"/queue/{name}", b"poison", **{"x-kind": "bad"})
    send(client, f"/queue/{name}", b"fine")
    subscribe(client, f"/queue/{name}", "s", ack="client-individual", **{"prefetch-count": "1"})
    message = client.expect("MESSAGE")
    assert message.body == b"poison"
    client.frame("NACK", {"id": message.headers["ack"], "requeue": "false"})
    nxt = client.expect("MESSAGE")
    assert nxt.body == b"fine" and nxt.headers["redelivered"] == "false"
    client.frame("ACK", {"id": nxt.headers["ack"]})
    subscribe(client, f"/queue/{name}.dlq", "dlq")
    dead = client.expect("MESSAGE")
    assert dead.body == b"poison"
    assert dead.headers["dlq-reason"] == "rejected" and dead.headers["x-kind"] == "bad"
    assert dead.headers["dlq-original-destination"] == f"/queue/{name}"
    wait_for(lambda: queue_depth(gearmand, name) == 0, message="the queue to empty")


def test_client_nack_is_cumulative_and_returns_messages_in_order(raw_clients):
    queue = f"/queue/{unique_topic()}"
    holder, other = raw_clients(), raw_clients()
    for body in (b"m1", b"m2", b"m3"):
        send(holder, queue, body)
    subscribe(holder, queue, "h", ack="client", **{"prefetch-count": "3"})
    held = [holder.expect("MESSAGE") for _ in range(3)]
    assert [m.body for m in held] == [b"m1", b"m2", b"m3"]
    subscribe(other, queue, "o", ack="client", **{"prefetch-count": "10"})
    # NACK of m2 in client mode covers m1 too; m3 stays held.
    holder.frame("NACK", {"id": held[1].headers["ack"], "receipt": "n"})
    assert holder.expect("RECEIPT").headers["receipt-id"] == "n"
    back = [other.expect("MESSAGE") for _ in range(2)]
    assert [m.body for m in back] == [b"m1", b"m2"]
    assert all(m.headers["redelivered"] == "true" for m in back)


def test_held_messages_come_back_in_order_when_their_consumer_leaves(raw_clients):
    queue = f"/queue/{unique_topic()}"
    holder, other = raw_clients(), raw_clients()
    for body in (b"m1", b"m2", b"m3"):
        send(holder, queue, body)
    subscribe(holder, queue, "h", ack="client-individual", **{"prefetch-count": "3"})
    assert [holder.expect("MESSAGE").body for _ in range(3)] == [b"m1", b"m2", b"m3"]
    subscribe(other, queue, "o", ack="client-individual", **{"prefetch-count": "10"})
    holder.close()
    back = [other.expect("MESSAGE") for _ in range(3)]
    assert [m.body for m in back] == [b"m1", b"m2", b"m3"]
    assert all(m.headers["redelivered"] == "true" for m in back)


def test_an_ack_written_together_with_the_disconnect_is_kept(raw_clients):
    """The ACK and the DISCONNECT are read together and handled with no
    pause between: the acked message's WORK_COMPLETE must reach gearmand
    before the bridge closes its Gearman connection, or it comes again."""
    queue = f"/queue/{unique_topic()}"
    holder, other = raw_clients(), raw_clients()
    for body in (b"m1", b"m2"):
        send(holder, queue, body)
    subscribe(holder, queue, "h", ack="client-individual", **{"prefetch-count": "1"})
    held = holder.expect("MESSAGE")
    assert held.body == b"m1"
    holder.send(b"ACK\nid:" + held.headers["ack"].encode() + b"\n\n\0"
                b"DISCONNECT\nreceipt:bye\n\n\0")
    assert holder.expect("RECEIPT").headers["receipt-id"] == "bye"
    send(other, queue, b"m3")
    subscribe(other, queue, "o", ack="auto", **{"prefetch-count": "10"})
    got = {other.expect("MESSAGE").body for _ in range(2)}
    assert got == {b"m2", b"m3"}  # m2 given back by the closing holder, m3 new
    # gearmand had m1 again at the close, if ever: before this. Held, m4 may
    # reach its subscriber before the RECEIPT (which waits for the fsync).
    other.frame("SEND", {"destination": queue, "receipt": "m4"}, b"m4")
    frames = [other.read_frame() for _ in range(2)]
    assert sorted((f.command, f.body if f.command == "MESSAGE" else f.headers["receipt-id"])
                  for f in frames) == [("MESSAGE", b"m4"), ("RECEIPT", "m4")], frames


def test_every_message_says_whether_it_is_redelivered(raw_clients):
    topic = unique_topic()
    client = raw_clients("1.1")
    subscribe(client, f"/topic/{topic}", "durable", durable="true")
    subscribe(client, f"/topic/{topic}", "plain")
    client.frame("SEND", {"destination": f"/topic/{topic}"}, b"t")
    messages = [client.expect("MESSAGE") for _ in range(2)]
    assert {m.headers["subscription"] for m in messages} == {"durable", "plain"}
    assert all(m.headers["redelivered"] == "false" for m in messages)
    client.frame("UNSUBSCRIBE", {"id": "durable", "durable": "true", "receipt": "u"})
    assert client.expect("RECEIPT").headers["receipt-id"] == "u"


# -- transactions ---------------------------------------------------------------------


def test_a_send_in_a_transaction_is_receipted_when_commit_makes_it_happen(raw_clients,
                                                                          gearmand):
    name = unique_topic("q")
    client = raw_clients()
    client.frame("BEGIN", {"transaction": "t1"})
    client.frame("SEND", {"destination": f"/queue/{name}", "transaction": "t1",
                          "receipt": "in-tx"}, b"held")
    send(client, f"/queue/{name}.other", b"now")  # frames are answered in order
    assert queue_depth(gearmand, name) == 0
    client.frame("COMMIT", {"transaction": "t1", "receipt": "commit"})
    assert client.expect("RECEIPT").headers["receipt-id"] == "in-tx"
    assert queue_depth(gearmand, name) == 1  # its receipt means it took effect
    assert client.expect("RECEIPT").headers["receipt-id"] == "commit"


def test_abort_discards_a_send_and_its_receipt_says_so(raw_clients, gearmand):
    name = unique_topic("q")
    client = raw_clients()
    client.frame("BEGIN", {"transaction": "t2"})
    client.frame("SEND", {"destination": f"/queue/{name}", "transaction": "t2",
                          "receipt": "in-tx"}, b"dropped")
    client.frame("ABORT", {"transaction": "t2", "receipt": "abort"})
    receipt = client.expect("RECEIPT")
    assert receipt.headers == {"receipt-id": "in-tx", "transaction-aborted": "t2"}
    assert client.expect("RECEIPT").headers["receipt-id"] == "abort"
    send(client, f"/queue/{name}", b"after")
    subscribe(client, f"/queue/{name}", "s")
    assert client.expect("MESSAGE").body == b"after"
