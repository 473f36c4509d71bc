"""The bridge's socket transport (gearhorn/stomp/server.py ClientConnection)
on a gevent socket pair: a turn's first frame is written at once, those
sent after it in the same turn together once the greenlet gives way; what
the socket cannot take, by the connection's writer, in order; ``on_sent``
always from the writer."""

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


def test_on_sent_runs_in_the_writer(pair):
    connection, theirs = pair
    sent = []
    connection.send(b"MESSAGE 1", lambda: sent.append(1))
    wait_for(lambda: sent == [1])
    assert theirs.recv(100) == b"MESSAGE 1"


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
