"""With several gearmand, a function's background jobs go to its home server
(gearhorn/gearman/client.py): the same whatever order a process lists the
servers in, written to every home before any reply is read, and a part its
home did not take goes on to the next server. Fake servers on socketpairs."""

from __future__ import annotations

import socket
import threading

import pytest

from gearhorn import gearman as g
from gearhorn.gearman import connection

pytestmark = pytest.mark.timeout(30)

# Nothing listens there: a client that outlived a failed test is refused.
SERVERS = [("127.0.0.1", 1), ("127.0.0.1", 2), ("127.0.0.1", 3)]


class FakeServers:
    """One socketpair per server: the client's end is what ``connect``
    returns, the far end scripts gearmand's replies and reads what came."""

    def __init__(self, monkeypatch):
        self.far: dict[tuple[str, int], socket.socket] = {}
        near: dict[tuple[str, int], socket.socket] = {}
        for address in SERVERS:
            near[address], self.far[address] = socket.socketpair()
        monkeypatch.setattr(connection, "connect",
                            lambda host, port, timeout=5.0, tls=None: near[(host, port)])

    def accept(self, address, count):
        """gearmand's JOB_CREATED for ``count`` jobs, queued before they come."""
        self.far[address].sendall(b"".join(
            g.encode(g.P.JOB_CREATED, f"H:{n}".encode(), magic=g.RES) for n in range(count)))

    def received(self, address, timeout=5.0) -> list[str]:
        """The functions of the background jobs this server was sent so far."""
        sock, reader, found = self.far[address], g.PacketReader(), []
        sock.settimeout(timeout)
        try:
            while chunk := sock.recv(1 << 20):
                found += [p.args[0].split(b"\0")[0].decode() for p in reader.feed(chunk)
                          if p.type == g.P.SUBMIT_JOB_BG]  # function, unique, data
                sock.settimeout(0.2)  # the rest of this write, if any
        except (TimeoutError, BlockingIOError):
            pass
        return found


def queues(count):
    return [f"news_c{n}" for n in range(count)]


def test_a_function_has_one_home_whatever_order_the_servers_are_listed_in():
    listed = g.Client(SERVERS)
    reordered = g.Client([SERVERS[2], SERVERS[0], SERVERS[1]])

    def home(client, queue):
        conn = client.connections[client.home(queue)]
        return conn.host, conn.port
    homes = {q: home(listed, q) for q in queues(60)}
    assert homes == {q: home(reordered, q) for q in queues(60)}
    assert set(homes.values()) == set(SERVERS)  # and every server is some queue's home


def test_each_job_goes_to_its_home_and_every_home_is_written_before_any_reply(monkeypatch):
    fake = FakeServers(monkeypatch)
    client = g.Client(SERVERS)
    copies = [g.Copy(q, f"m{i}:{q}", b"x") for i in range(3) for q in queues(12)]
    parts = {address: [c.function for c in copies if SERVERS[client.home(c.function)] == address]
             for address in SERVERS}
    # The home of the first job is written first; it holds its replies back.
    first = SERVERS[client.home(copies[0].function)]
    others = [a for a in SERVERS if parts[a] and a != first]
    assert others
    for address in others:
        fake.accept(address, len(parts[address]))
    submitting = threading.Thread(target=client.submit_background, args=(copies,), daemon=True)
    submitting.start()
    # The first home has not answered yet, and the others have their parts:
    # nobody waited for its replies before writing to them.
    for address in others:
        assert fake.received(address) == parts[address]
    assert fake.received(first) == parts[first]
    fake.accept(first, len(parts[first]))
    submitting.join(10)
    assert not submitting.is_alive()
    # In order per queue, on one server each.
    assert all(parts[a] == [c.function for c in copies if c.function in set(parts[a])]
               for a in SERVERS)


def test_what_a_home_did_not_take_goes_on_to_the_next_server(monkeypatch):
    fake = FakeServers(monkeypatch)
    client = g.Client(SERVERS)
    queue = next(q for q in queues(60) if client.home(q) == 0)
    copies = [g.Copy(queue, f"m{i}", b"x") for i in range(3)]
    fake.accept(SERVERS[0], 1)
    fake.far[SERVERS[0]].shutdown(socket.SHUT_WR)  # it goes after one
    fake.accept(SERVERS[1], 2)
    assert client.submit_background(copies) == 3
    assert fake.received(SERVERS[0]) == [queue] * 3  # written, one taken
    assert fake.received(SERVERS[1]) == [queue] * 2  # the two it did not take
    assert fake.received(SERVERS[2], timeout=0.2) == []


def test_one_server_is_every_functions_home():
    client = g.Client(SERVERS[:1])
    assert {client.home(q) for q in queues(20)} == {0}
