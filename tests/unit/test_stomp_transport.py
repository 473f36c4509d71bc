"""The bridge's socket transport (gearhorn/stomp/server.py ClientConnection)
on a gevent socket pair: bytes written at once when nothing waits before
them, the rest by the writer, in order; ``on_sent`` always from the writer."""

import gevent
import gevent.socket
import pytest

from gearhorn.stomp.frames import Limits
from gearhorn.stomp.rules import SessionSettings
from gearhorn.stomp.server import ClientConnection
from tests.fakes import FakeBroker

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def pair():
    ours, theirs = gevent.socket.socketpair()
    connection = ClientConnection(ours, ("test", 0), FakeBroker().backend(), Limits(),
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


def test_bytes_go_out_at_once_and_on_sent_runs_in_the_writer(pair):
    connection, theirs = pair
    sent = []
    connection.send(b"MESSAGE 1", lambda: sent.append(1))
    # On the wire before this greenlet gave way once; the callback waits for the writer.
    theirs.setblocking(False)
    assert theirs.recv(100) == b"MESSAGE 1"
    assert sent == [] and connection.backlog == 0
    gevent.sleep(0)
    assert sent == [1]


def test_what_the_socket_cannot_take_now_is_written_later_in_order(pair):
    connection, theirs = pair
    sent, big = [], b"x" * (8 << 20)  # more than any socket buffer holds
    connection.send(big, lambda: sent.append("big"))
    assert connection.backlog > 0  # the rest is the writer's
    connection.send(b"after", lambda: sent.append("after"))
    assert read_exactly(theirs, len(big) + 5) == big + b"after"
    deadline = gevent.Timeout(10)
    with deadline:
        while sent != ["big", "after"]:
            gevent.sleep(0.01)
    assert connection.backlog == 0


def test_bytes_written_at_once_count_as_sent_when_the_connection_ends(pair):
    connection, theirs = pair
    sent, dropped = [], []
    connection.send(b"one", lambda: sent.append(1), lambda: dropped.append(1))
    connection._writer.kill()  # the connection ends before the writer ran
    connection._drop_unsent()
    assert sent == [1] and dropped == []
