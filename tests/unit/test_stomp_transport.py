"""The bridge's socket transport (gearhorn/stomp/transport/server.py ClientConnection)
on a gevent socket pair: a turn's first frame is written at once, those
sent after it in the same turn together once the greenlet gives way (and,
while frames read together are handled, all of them at the end); what
the socket cannot take, by the connection's writer, in order; ``on_sent``
from the writer, unless sent ``inline``."""

import gevent
import gevent.event
import gevent.socket
import pytest

from gearhorn.stomp.protocol.frames import FrameLimits
from gearhorn.stomp.protocol.rules import SessionSettings
from gearhorn.stomp.transport.server import _WRITES, ClientConnection
from tests.fakes import FakeBroker

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def pair():
    ours, theirs = gevent.socket.socketpair()
    connection = ClientConnection(ours, ("test", 0), FakeBroker().backend(), FrameLimits(),
                                  SessionSettings(), connect_timeout=10)
    yield connection, theirs
    connection.close()
    theirs.close()
    ours.close()


def read_exactly(sock, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "closed early"
        data += chunk
    return data


def wait_for(condition, seconds: float = 10) -> None:
    with gevent.Timeout(seconds):
        while not condition():
            gevent.sleep(0.001)


def test_a_turns_first_frame_goes_out_at_once_and_the_rest_together_after_it(pair):
    connection, theirs = pair
    sent = []
    connection._writer.kill()  # so that only the sending greenlet and the loop write
    theirs.setblocking(False)
    connection.send(b"MESSAGE 1|", lambda: sent.append(1))
    assert theirs.recv(100) == b"MESSAGE 1|"  # before this greenlet gave way
    connection.send(b"MESSAGE 2|", lambda: sent.append(2))
    connection.send(b"MESSAGE 3|", lambda: sent.append(3))
    assert connection.backlog == 20  # these wait for the end of the turn
    gevent.sleep(0)
    assert theirs.recv(100) == b"MESSAGE 2|MESSAGE 3|"  # in one write
    assert connection.backlog == 0 and sent == []  # on_sent is the writer's
    assert len(connection._written) == 3  # waiting for it


def test_held_writes_go_out_together_when_the_block_ends(pair):
    connection, theirs = pair
    connection._writer.kill()
    theirs.setblocking(False)
    with _WRITES.held():
        connection.send(b"MESSAGE 1|")
        connection.send(b"MESSAGE 2|")
        with pytest.raises(BlockingIOError):  # not even the first went out
            theirs.recv(100)
    assert theirs.recv(100) == b"MESSAGE 1|MESSAGE 2|"  # at the end, in one write
    assert connection.backlog == 0


def test_another_greenlets_writes_do_not_wait_for_a_held_block(pair):
    connection, theirs = pair
    connection._writer.kill()
    theirs.setblocking(False)
    released = gevent.event.Event()

    def holding_and_blocked():
        with _WRITES.held():
            released.wait()  # on Redis, say

    holder = gevent.spawn(holding_and_blocked)
    gevent.sleep(0)
    assert _WRITES.holder is holder
    connection.send(b"MESSAGE 1|")
    assert theirs.recv(100) == b"MESSAGE 1|"  # at once, as ever
    released.set()
    holder.join(5)
    assert _WRITES.holder is None


def test_frames_read_together_are_answered_in_one_write(pair):
    connection, theirs = pair
    connection._writer.kill()
    reader = gevent.spawn(connection._read_loop)
    theirs.sendall(b"CONNECT\naccept-version:1.2\nhost:h\n\n\0")
    assert b"CONNECTED" in theirs.recv(1000)
    writes = []

    class Counted:  # the socket, its writes noted
        def __init__(self, sock):
            self.sock = sock

        def send(self, data, *args):
            writes.append(bytes(data))
            return self.sock.send(data, *args)

        def __getattr__(self, name):
            return getattr(self.sock, name)

    connection.sock = Counted(connection.sock)
    theirs.sendall(b"".join(b"BEGIN\ntransaction:t%d\nreceipt:r%d\n\n\0" % (n, n)
                            for n in range(3)))
    wait_for(lambda: writes)
    assert writes == [b"".join(b"RECEIPT\nreceipt-id:r%d\n\n\0" % n for n in range(3))]
    reader.kill()


def test_on_sent_runs_in_the_writer(pair):
    connection, theirs = pair
    sent = []
    connection.send(b"MESSAGE 1", lambda: sent.append(1))
    wait_for(lambda: sent == [1])
    assert theirs.recv(100) == b"MESSAGE 1"


def test_an_inline_on_sent_runs_as_its_bytes_are_written(pair):
    connection, theirs = pair
    sent = []
    connection._writer.kill()  # nothing but the write itself runs them
    connection.send(b"MESSAGE 1|", lambda: sent.append("inline"), inline=True)
    assert sent == ["inline"]  # before this greenlet gave way
    connection.send(b"MESSAGE 2|", lambda: sent.append("later"), inline=True)
    connection.send(b"MESSAGE 3|", lambda: sent.append("writer's"))
    gevent.sleep(0)  # the loop writes the rest of the turn
    assert theirs.recv(100) == b"MESSAGE 1|MESSAGE 2|MESSAGE 3|"
    assert sent == ["inline", "later"]
    assert [callback.__name__ for callback in connection._written] == ["<lambda>"]


def test_what_the_socket_cannot_take_now_is_written_later_in_order(pair):
    connection, theirs = pair
    sent, big = [], b"x" * (8 << 20)  # more than any socket buffer holds
    connection.send(big, lambda: sent.append("big"))
    gevent.sleep(0)
    assert 0 < connection.backlog < len(big)  # the rest is the writer's
    connection.send(b"after", lambda: sent.append("after"))
    assert read_exactly(theirs, len(big) + 5) == big + b"after"
    wait_for(lambda: sent == ["big", "after"])
    assert connection.backlog == 0


def test_bytes_written_at_once_count_as_sent_when_the_connection_ends(pair):
    connection, theirs = pair
    sent, dropped = [], []
    connection._writer.kill()  # the connection ends before the writer ran
    connection.send(b"one", lambda: sent.append(1), lambda: dropped.append(1))
    gevent.sleep(0)
    assert theirs.recv(100) == b"one"
    connection._drop_unsent()
    assert sent == [1] and dropped == []


# -- WebSocket: the same at-once writes, a frame never split between writers ------


def ws_pair():
    """A WebSocketStream (``ours``) and a wsproto client reading what it writes."""
    from wsproto import ConnectionType
    from wsproto.connection import Connection, ConnectionState

    from gearhorn.stomp.transport.websocket import WebSocketStream

    ours, theirs = gevent.socket.socketpair()
    client = Connection(ConnectionType.CLIENT)  # the upgrade is not what is tested here
    client._state = ConnectionState.OPEN
    return WebSocketStream(ours, "v12.stomp"), theirs, client


def messages(client, sock, count):
    from wsproto.events import Message

    got, part = [], ""
    while len(got) < count:
        client.receive_data(sock.recv(1 << 20))
        for event in client.events():
            if isinstance(event, Message):  # a large one comes in parts
                part += event.data
                if event.message_finished:
                    got.append(part)
                    part = ""
    return got


def test_a_websocket_takes_a_frame_at_once_and_its_rest_goes_before_anything_else():
    stream, theirs, client = ws_pair()
    assert stream.send(b"MESSAGE 1|") == 10
    assert messages(client, theirs, 1) == ["MESSAGE 1|"]
    # A frame the socket takes only in part: taken, its end kept for flush().
    stream.sock.setsockopt(gevent.socket.SOL_SOCKET, gevent.socket.SO_SNDBUF, 4096)
    big = b"x" * 1_000_000
    assert stream.send(big) == len(big) and stream.unflushed
    assert stream.send(b"MESSAGE 2|") == 0  # not before that end: the writer's
    reader = gevent.spawn(messages, client, theirs, 2)
    stream.flush()
    stream.sendall(b"MESSAGE 2|")
    assert reader.get(timeout=10) == ["x" * 1_000_000, "MESSAGE 2|"]
    assert not stream.unflushed


def test_a_websocket_write_under_way_is_not_joined():
    stream, theirs, client = ws_pair()
    with stream._write_lock:  # the reader answering a ping, say
        assert stream.send(b"MESSAGE|") == 0
    assert stream.send(b"\xff\xfe") == 2  # not UTF-8: a binary message
    client.receive_data(theirs.recv(100))
    (event,) = list(client.events())
    assert event.data == b"\xff\xfe"


def test_a_websocket_answers_a_ping_and_a_close_then_ends():
    from wsproto.events import CloseConnection, Message, Ping

    stream, theirs, client = ws_pair()
    theirs.sendall(client.send(Message(data="SEND\n\n\0")) + client.send(Ping(payload=b"p")))
    assert stream.recv(1000) == b"SEND\n\n\0"
    client.receive_data(theirs.recv(100))
    assert [event.payload for event in client.events()] == [b"p"]  # the pong
    theirs.sendall(client.send(CloseConnection(code=1001)))
    assert stream.recv(1000) == b""  # the end, as a socket says it
    stream.shutdown(gevent.socket.SHUT_WR)  # as the connection does once its writes are out
    client.receive_data(theirs.recv(100))
    (close,) = list(client.events())
    assert isinstance(close, CloseConnection) and close.code == 1001  # its code, echoed


def test_a_broken_websocket_frame_ends_it_with_1002_after_the_answers_before_it():
    from wsproto.events import CloseConnection, Message

    stream, theirs, client = ws_pair()
    theirs.sendall(client.send(Message(data="SEND\nreceipt:r\n\n\0")) + b"\x81\x01x")  # unmasked
    assert stream.recv(1000) == b"SEND\nreceipt:r\n\n\0"
    assert stream.recv(1000) == b""
    stream.sendall(b"RECEIPT\nreceipt-id:r\n\n\0")  # the session's answer still goes out
    stream.shutdown(gevent.socket.SHUT_WR)
    events = []
    while not any(isinstance(event, CloseConnection) for event in events):
        client.receive_data(theirs.recv(1000))
        events += client.events()
    receipt, close = events
    assert isinstance(receipt, Message) and receipt.data.startswith("RECEIPT")
    assert close.code == 1002 and "masked" in close.reason
    with pytest.raises(ConnectionError):
        stream.sendall(b"MESSAGE\n\n\0")  # nothing after the close frame


def test_frames_sent_right_behind_the_upgrade_request_are_read():
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, Request

    from gearhorn.stomp.transport.websocket import accept

    ours, theirs = gevent.socket.socketpair()
    client = WSConnection(ConnectionType.CLIENT)
    connect = b"CONNECT\n\n\0"  # an eager client's, in the same write as its request
    masked = b"\x81" + bytes([0x80 | len(connect)]) + b"\0\0\0\0" + connect  # key 0
    theirs.sendall(client.send(Request(host="h", target="/ws", subprotocols=["v12.stomp"]))
                   + masked)
    stream = accept(ours, timeout=10)
    client.receive_data(theirs.recv(1000))
    assert isinstance(next(client.events()), AcceptConnection)
    assert stream.subprotocol == "v12.stomp"
    assert stream.recv(1000) == connect
