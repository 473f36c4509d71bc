
import socket

import pytest

from gearhorn import gearman as g
from gearhorn.gearman import connection
from tests.fakes import chunkings


def stream():
    packets = [
        g.Packet(g.P.JOB_CREATED, (b"H:host:1",)),
        g.Packet(g.P.WORK_COMPLETE, (b"H:host:1", b"data\0with\0nuls")),
        g.Packet(g.P.WORK_FAIL, (b"H:host:2",)),
        g.Packet(g.P.NOOP, ()),
        g.Packet(g.P.WORK_WARNING, (b"H:host:3", b"")),
        g.Packet(g.P.ERROR, (b"ARGUMENT_TOO_LARGE", b"Unique value too large")),
    ]
    wire = b"".join(g.encode(p.type, *p.args, magic=g.RES) for p in packets)
    return packets, wire


def test_reader_decodes_every_chunking():
    packets, wire = stream()
    for chunks in chunkings(wire, seed=7, splits=50, most_cuts=10):
        reader = g.PacketReader()
        out = [p for chunk in chunks for p in reader.feed(chunk)]
        assert out == packets


def test_last_argument_keeps_its_nul_bytes():
    (packet,) = g.PacketReader().feed(g.encode(g.P.WORK_COMPLETE, b"h", b"a\0b", magic=g.RES))
    assert packet.args == (b"h", b"a\0b")


def test_encode_header():
    assert g.encode(g.P.SUBMIT_JOB_BG, b"f", b"u", b"x") == (
        b"\0REQ" + (18).to_bytes(4, "big") + (5).to_bytes(4, "big") + b"f\0u\0x")


@pytest.mark.parametrize("wire", [
    b"HTTP/1.1 200 OK\r\n",
    b"\0RES" + (8).to_bytes(4, "big") + (2**31).to_bytes(4, "big"),
])
def test_reader_rejects_garbage(wire):
    with pytest.raises(g.PacketError):
        g.PacketReader().feed(wire)


def test_outcomes_carry_the_warning_as_reason():
    answers = g.Answers()
    assert answers.heard(g.Packet(g.P.WORK_WARNING, (b"h", b"bad topic"))) is None
    fail = answers.heard(g.Packet(g.P.WORK_FAIL, (b"h",)))
    assert (fail.status, fail.reason, fail.warnings) == ("failed", "bad topic", (b"bad topic",))
    assert answers.heard(g.Packet(g.P.WORK_COMPLETE, (b"h", b"ok"))).ok


def test_everything_a_worker_says_before_the_end_is_kept_with_it():
    answers = g.Answers()
    for packet in (g.Packet(g.P.WORK_DATA, (b"h", b"pa")), g.Packet(g.P.WORK_STATUS,
                   (b"h", b"1", b"4")), g.Packet(g.P.WORK_DATA, (b"h", b"rt")),
                   g.Packet(g.P.WORK_DATA, (b"other", b"x"))):
        assert answers.heard(packet) is None
    done = answers.heard(g.Packet(g.P.WORK_COMPLETE, (b"h", b"result")))
    assert (done.data, done.partial, done.progress) == (b"result", b"part", (1, 4))
    assert done.handle == b"h"  # which job ended: two of one unique are two runs


@pytest.mark.parametrize("wire, status, reason", [
    # gearmand 1.1.20 to a client that did not ask for exceptions: a NUL after the handle
    (b"H:vm:7\0", "failed", "job failed"),
    (b"H:vm:7", "failed", "job failed"),
])
def test_a_work_fail_with_or_without_a_trailing_nul_ends_its_job(wire, status, reason):
    (packet,) = g.PacketReader().feed(b"\0RES" + int(g.P.WORK_FAIL).to_bytes(4, "big")
                                      + len(wire).to_bytes(4, "big") + wire)
    assert packet.args == (b"H:vm:7",)
    outcome = g.Answers().heard(packet)
    assert (outcome.status, outcome.reason) == (status, reason)


@pytest.mark.parametrize("data, reason", [
    (b"division by zero", "division by zero"),  # PHP's sendException, Node, gear
    (b"\x05\x0b\x04\n\x1fJob died at worker.pl line 12.\n", "Job died at worker.pl line 12."),
])
def test_an_exception_ends_its_job_with_its_text(data, reason):
    outcome = g.Answers().heard(g.Packet(g.P.WORK_EXCEPTION, (b"h", data)))
    assert (outcome.status, outcome.reason, outcome.data) == ("exception", reason, data)


class FakeGearmand:
    """The far end of a socketpair, answering with scripted packets."""

    def __init__(self, monkeypatch):
        import socket
        ours, self.theirs = socket.socketpair()
        monkeypatch.setattr(connection, "connect", lambda host, port, timeout=5.0, tls=None: ours)
        self.conn = g.Connection("fake", 1)

    def reply(self, *packets):
        self.theirs.sendall(b"".join(g.encode(t, *a, magic=g.RES) for t, a in packets))


def test_results_that_overtake_job_created_are_kept(monkeypatch):
    fake = FakeGearmand(monkeypatch)
    fake.reply((g.P.JOB_CREATED, (b"H:1",)), (g.P.WORK_COMPLETE, (b"H:1", b"one")),
               (g.P.WORK_WARNING, (b"H:2", b"bad")), (g.P.JOB_CREATED, (b"H:2",)),
               (g.P.WORK_FAIL, (b"H:2",)))
    copies = [g.Copy("f", "u1", b"a"), g.Copy("f", "u2", b"b")]
    handles = fake.conn.submit(copies, background=False)
    assert handles == [b"H:1", b"H:2"]
    outcomes = g.wait_for_results(fake.conn, handles, timeout=2)
    assert [(o.status, o.data, o.reason) for o in outcomes] == [
        ("complete", b"one", ""), ("failed", b"", "bad")]


def test_wait_for_results_times_out_without_spinning(monkeypatch):
    import time
    fake = FakeGearmand(monkeypatch)
    fake.reply((g.P.JOB_CREATED, (b"H:1",)))
    handles = fake.conn.submit([g.Copy("f", "u", b"")], background=False)
    reads = []
    real_recv = fake.conn._recv_until
    monkeypatch.setattr(fake.conn, "_recv_until",
                        lambda deadline: reads.append(deadline) or real_recv(deadline))
    start = time.monotonic()
    (outcome,) = g.wait_for_results(fake.conn, handles, timeout=0.3)
    assert outcome.status == "timeout"
    # One blocking wait for the whole timeout, not a loop of short ones.
    assert len(reads) == 1 and reads[0] >= start + 0.3


def test_error_reply_reports_how_many_were_accepted(monkeypatch):
    fake = FakeGearmand(monkeypatch)
    fake.reply((g.P.JOB_CREATED, (b"H:1",)), (g.P.ERROR, (b"ARGUMENT_TOO_LARGE", b"too big")))
    with pytest.raises(g.PartialSubmit, match="too big") as info:
        fake.conn.submit([g.Copy("f", "u", b""), g.Copy("f", "v" * 99, b"")])
    assert info.value.accepted == 1


def test_a_grabs_reply_says_which_answers_gearmand_has_read(monkeypatch):
    """gearmand handles a connection's packets in order: the reply to a GRAB
    means it read the answers written before that GRAB, and only those."""
    import socket
    ours, theirs = socket.socketpair()
    monkeypatch.setattr(connection, "connect", lambda host, port, timeout=5.0, tls=None: ours)
    worker = g.WorkerConnection("fake", 1, ["q"])
    worker.open()
    flushes = []
    worker.coalesce = flushes.append  # the owner flushes when it likes
    worker.complete(b"H:1")
    worker.flush()
    worker.complete(b"H:2")  # given, not yet written when the GRAB goes
    assert (worker.answers_given, worker.answers_read) == (2, 0)
    theirs.sendall(g.encode(g.P.NO_JOB, magic=g.RES))
    assert worker.grab(1) == []
    assert worker.answers_read == 1
    worker.flush()
    theirs.sendall(g.encode(g.P.NO_JOB, magic=g.RES))
    worker.grab(1)
    assert worker.answers_read == 2
    worker.close()
    theirs.close()


def test_answers_gathered_for_a_flush_are_written_before_the_close(monkeypatch):
    import socket
    ours, theirs = socket.socketpair()
    monkeypatch.setattr(connection, "connect", lambda host, port, timeout=5.0, tls=None: ours)
    worker = g.WorkerConnection("fake", 1, ["q"])
    worker.open()
    worker.coalesce = lambda flush: None  # the flush never comes: the close must write
    worker.complete(b"H:1")
    worker.close()
    theirs.settimeout(5)
    got = b""
    while chunk := theirs.recv(1000):  # until the close
        got += chunk
    assert got.endswith(g.encode(g.P.WORK_COMPLETE, b"H:1", b""))  # after its CAN_DOs
    theirs.close()


def test_counting_job_created_agrees_with_decoding_at_every_chunking():
    """The background submit's fast path (PacketReader.count_created) sees
    what feed sees: JOB_CREATED counted up to the number wanted, the other
    packets in order, and what came after left for feed."""
    before = [g.Packet(g.P.OPTION_RES, (b"exceptions",)),
              g.Packet(g.P.WORK_COMPLETE, (b"H:9", b"early\0answer"))]
    after = [g.Packet(g.P.JOB_CREATED, (b"H:extra",)), g.Packet(g.P.NOOP, ())]
    created = [g.Packet(g.P.JOB_CREATED, (b"H:host:%d" % i,)) for i in range(5)]
    sent = [before[0], *created[:3], before[1], *created[3:], *after]
    wire = b"".join(g.encode(p.type, *p.args, magic=g.RES) for p in sent)
    for chunks in chunkings(wire, seed=11, splits=60, most_cuts=12):
        reader, count, others, rest = g.PacketReader(), 0, [], []
        for chunk in chunks:
            if count < 5:
                n, found = reader.count_created(chunk, 5 - count)
                count, others = count + n, others + found
                rest += reader.feed(b"") if count == 5 else []
            else:
                rest += reader.feed(chunk)
        assert (count, others, rest) == (5, before, after)


def test_counting_stops_at_an_error_with_what_came_before_it():
    sent = [g.Packet(g.P.JOB_CREATED, (b"H:1",)),
            g.Packet(g.P.ERROR, (b"QUEUE_ERROR", b"full")),
            g.Packet(g.P.JOB_CREATED, (b"H:3",))]
    reader = g.PacketReader()
    count, others = reader.count_created(
        b"".join(g.encode(p.type, *p.args, magic=g.RES) for p in sent), 3)
    assert (count, others) == (1, [sent[1]])
    assert reader.feed(b"") == [sent[2]]


def test_a_background_submit_leaves_what_follows_its_replies_to_read(monkeypatch):
    fake = FakeGearmand(monkeypatch)
    fake.reply((g.P.JOB_CREATED, (b"H:1",)), (g.P.JOB_CREATED, (b"H:2",)),
               (g.P.WORK_COMPLETE, (b"H:0", b"later")))
    assert fake.conn.submit([g.Copy("f", "u", b""), g.Copy("f", "v", b"")]) == []
    assert fake.conn.buffered  # decoded already: no wait on the socket for it
    assert fake.conn.read() == g.Packet(g.P.WORK_COMPLETE, (b"H:0", b"later"))


def test_a_connection_lost_mid_submit_says_how_many_were_accepted(monkeypatch):
    fake = FakeGearmand(monkeypatch)
    fake.reply((g.P.JOB_CREATED, (b"H:1",)), (g.P.JOB_CREATED, (b"H:2",)))
    fake.theirs.shutdown(socket.SHUT_WR)  # gearmand goes after two replies
    with pytest.raises(g.PartialSubmit, match="closed the connection") as info:
        fake.conn.submit([g.Copy("f", str(n), b"") for n in range(3)])
    assert info.value.accepted == 2


@pytest.mark.parametrize("background", [True, False])
def test_a_gearmand_that_stops_answering_fails_the_submission_in_time(monkeypatch, background):
    """Not a wait for ever: a worker or a bridge's SEND held by a silent
    gearmand fails over like one held by a broken connection."""
    fake = FakeGearmand(monkeypatch)
    fake.conn.reply_timeout = 0.2
    fake.reply((g.P.JOB_CREATED, (b"H:1",)))  # then silence
    with pytest.raises(g.PartialSubmit, match="answered nothing for 0.2s") as info:
        fake.conn.submit([g.Copy("f", "u", b""), g.Copy("f", "v", b"")], background=background)
    assert info.value.accepted == 1
    assert not fake.conn.is_open  # a late reply is never read as another submission's


def holder_on(fake):
    from gearhorn.gearman import holder

    lost = []
    held = holder.Holder("fake", 1, lambda copy, outcome: None,
                         lambda copies, reason: lost.append((len(copies), reason)))
    held.conn = fake.conn
    return held, lost


def test_a_holder_takes_a_gearmand_that_creates_nothing_for_a_while_for_gone(monkeypatch):
    """A silent gearmand (its node lost, its cable pulled) holds a fanout no
    longer than the reply timeout, not TCP's 10 s: the copies go elsewhere."""
    fake = FakeGearmand(monkeypatch)
    held, lost = holder_on(fake)
    fake.reply((g.P.JOB_CREATED, (b"H:1",)))  # then silence
    with pytest.raises(g.Unavailable, match="created no job for 0.3s"):
        held.hold([g.Copy("f", "u", b""), g.Copy("f", "v", b"")], timeout=0.3)
    assert lost == [(2, "gearmand created no job for 0.3s and its host takes no connection: "
                        "taken for gone")]


def test_a_holder_waits_as_long_as_gearmand_keeps_creating(monkeypatch):
    """A busy gearmand answers slowly but steadily: that is no silence."""
    import threading
    import time

    fake = FakeGearmand(monkeypatch)
    held, lost = holder_on(fake)

    def slowly():
        for n in range(8):
            time.sleep(0.1)
            fake.reply((g.P.JOB_CREATED, (b"H:%d" % n,)))
    thread = threading.Thread(target=slowly)
    thread.start()
    held.hold([g.Copy("f", f"u{n}", b"") for n in range(8)], timeout=0.3)  # 0.8 s in all
    thread.join()
    assert held.held() == 8 and lost == []


def test_a_holder_waits_for_a_silent_gearmand_whose_host_still_takes_connections(monkeypatch):
    """Silent for longer than the timeout, but its host accepts a new
    connection: a slow server on a loaded machine, not a lost node. Its jobs
    stay (taken for gone, a running one would have run twice)."""
    import threading

    from gearhorn.gearman import holder

    fake = FakeGearmand(monkeypatch)
    held, lost = holder_on(fake)
    asked = threading.Event()

    def reachable(host, port, timeout=0.5):
        if not asked.is_set():
            asked.set()
            fake.reply((g.P.JOB_CREATED, (b"H:1",)))  # it answers while we ask
        return True
    monkeypatch.setattr(holder, "reachable", reachable)
    held.hold([g.Copy("f", "u", b"")], timeout=0.2)
    assert asked.is_set() and held.held() == 1 and lost == []


def test_a_holder_gives_up_on_a_frozen_gearmand_whose_host_takes_connections(monkeypatch):
    """A gearmand frozen on a live host: its kernel takes connections and
    acknowledges what is sent, so only a bound in all ends the wait."""
    from gearhorn.gearman import holder

    fake = FakeGearmand(monkeypatch)
    held, lost = holder_on(fake)
    monkeypatch.setattr(holder, "reachable", lambda host, port, timeout=0.5: True)
    monkeypatch.setattr(holder, "SLOW_LIMIT", 0.3)
    with pytest.raises(g.Unavailable, match="created no job for 0.3s: taken for gone"):
        held.hold([g.Copy("f", "u", b"")], timeout=0.1)
    assert lost == [(1, "gearmand created no job for 0.3s: taken for gone")]
