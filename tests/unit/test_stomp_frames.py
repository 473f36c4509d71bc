
import pytest

from gearhorn.stomp.protocol.frames import Frame, FrameError, FrameLimits, FrameParser, encode
from tests.fakes import chunkings


def parse_all(wire: bytes, version="1.2", limits=None):
    results = []
    for chunks in chunkings(wire):
        parser = FrameParser(limits)
        parser.version = version
        frames = [f for chunk in chunks for f in parser.feed(chunk)]
        assert parser.pending == 0
        results.append(frames)
    first = results[0]
    assert all(r == first for r in results), "chunking changed the result"
    return first


def test_simple_frames_and_heartbeats_between_them():
    wire = (b"\n\r\nCONNECT\naccept-version:1.2\nhost:h\n\n\0\n"
            b"SEND\r\ndestination:/queue/a\r\n\r\nhello\0")
    frames = parse_all(wire)
    assert frames == [Frame("CONNECT", {"accept-version": "1.2", "host": "h"}, b""),
                      Frame("SEND", {"destination": "/queue/a"}, b"hello")]


def test_a_stray_nul_between_frames_is_skipped_not_a_heartbeat():
    """RabbitMQ's suite (parsing.py) sends ``\\n\\0SUBSCRIBE``; RabbitMQ skips it."""
    wire = b"\n\0SEND\ndestination:/queue/a\n\nx\0\n\0\0SEND\ndestination:/queue/b\n\ny\0"
    assert [f.headers["destination"] for f in parse_all(wire)] == ["/queue/a", "/queue/b"]
    parser = FrameParser()
    parser.feed(b"\0\0\n")
    assert parser.heartbeats == 1


def test_content_length_body_keeps_nul_bytes():
    body = b"a\0b\0\0c\n\n"
    wire = b"SEND\ndestination:/queue/a\ncontent-length:%d\n\n%s\0" % (len(body), body)
    (frame,) = parse_all(wire * 3)[:1]
    assert frame.body == body
    assert len(parse_all(wire * 3)) == 3


def test_header_escapes_in_1_2_but_not_in_connect():
    wire = (b"CONNECT\nlogin:a\\cb\n\n\0"
            b"SEND\ndestination:/queue/x\nkey\\cname:line\\nbreak\\\\back\\rcr\n\n\0")
    connect, send = parse_all(wire)
    assert connect.headers["login"] == "a\\cb"
    assert send.headers["key:name"] == "line\nbreak\\back\rcr"


def test_no_unescaping_in_1_0():
    (frame,) = parse_all(b"SEND\ndestination:a\\nb\n\n\0", version="1.0")
    assert frame.headers["destination"] == "a\\nb"


def test_repeated_header_first_wins():
    (frame,) = parse_all(b"SEND\ndestination:/queue/first\ndestination:/queue/second\n\n\0")
    assert frame.headers["destination"] == "/queue/first"


def test_header_value_may_contain_colons_in_1_0():
    (frame,) = parse_all(b"SEND\nurl:http://x:1/\n\n\0", version="1.0")
    assert frame.headers["url"] == "http://x:1/"


def test_roundtrip_through_encode():
    frame = Frame("MESSAGE", {"destination": "/topic/a:b", "x": "multi\nline\\"},
                  b"\0binary\0")
    wire = encode(frame.command, frame.headers, frame.body, "1.2")
    (parsed,) = parse_all(wire)
    assert parsed.headers["destination"] == "/topic/a:b"
    assert parsed.headers["x"] == "multi\nline\\"
    assert parsed.body == frame.body


def test_encode_connected_is_not_escaped():
    assert encode("CONNECTED", {"server": "a:b"}, version="1.2").startswith(
        b"CONNECTED\nserver:a:b\n")


MALFORMED = [
    (b"send\n\n\0", "invalid command"),
    (b"SEND 1\n\n\0", "invalid command"),
    (b"SEND\nnocolon\n\n\0", "malformed header line"),
    (b"SEND\n:value\n\n\0", "malformed header line"),
    (b"SEND\nbad:esc\\t\n\n\0", "undefined escape"),
    (b"SEND\nh:\xff\xfe\n\n\0", "not UTF-8"),
    (b"SEND\nh:a\0b\n\nbody\0", "NUL byte in frame headers"),
    (b"SEND\ncontent-length:abc\n\n\0", "invalid content-length"),
    (b"SEND\ncontent-length:-1\n\n\0", "invalid content-length"),
    (b"SEND\ncontent-length:2\n\nabc\0", "longer than its content-length"),
    (b"\rSEND\n\n\0", "CR not followed by LF"),
]


@pytest.mark.parametrize("wire, reason", MALFORMED)
def test_malformed_frames_raise_in_every_chunking(wire, reason):
    for chunks in chunkings(wire):
        parser = FrameParser()
        parser.version = "1.2"
        with pytest.raises(FrameError, match=reason):
            for chunk in chunks:
                parser.feed(chunk)


def test_limits_are_enforced_before_the_frame_ends():
    limits = FrameLimits(max_frame=100, max_headers=3, max_header_length=20)
    parser = FrameParser(limits)
    with pytest.raises(FrameError, match="larger than 100"):
        parser.feed(b"SEND\n\n" + b"x" * 200)  # no NUL yet: refused while arriving
    with pytest.raises(FrameError, match="larger than 100"):
        FrameParser(limits).feed(b"SEND\ncontent-length:500\n\n")
    with pytest.raises(FrameError, match="more than 3 headers"):
        FrameParser(limits).feed(b"SEND\na:1\nb:1\nc:1\nd:1\n\n\0")
    with pytest.raises(FrameError, match="header longer than 20"):
        FrameParser(limits).feed(b"SEND\na:" + b"x" * 30 + b"\n\n\0")
    with pytest.raises(FrameError, match="headers too large"):
        FrameParser(limits).feed(b"SEND\n" + b"a:1\n" * 100)  # endless headers


def test_heartbeats_are_counted():
    parser = FrameParser()
    assert parser.feed(b"\n\n\r\n") == []
    assert parser.heartbeats == 3


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_header_names_with_escapes_roundtrip(version):
    headers = {"key:one": "v:1", "naïve name": "ü", "two\nlines": "a\\b"}
    (parsed,) = parse_all(encode("MESSAGE", headers, b"x", version), version=version)
    assert {k: parsed.headers[k] for k in headers} == headers


def test_1_0_leaves_out_header_names_it_cannot_write():
    wire = encode("MESSAGE", {"key:one": "1", "plain": "a:b\nc"}, b"", "1.0")
    (parsed,) = parse_all(wire, version="1.0")
    assert parsed.headers == {"plain": "a:b c"}


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
@pytest.mark.parametrize("ack", [False, True])
def test_the_fast_message_frame_reads_as_encode_writes_it(version, ack):
    from gearhorn.stomp.protocol.frames import message_frame, message_prefix

    prefix = message_prefix("sub:1", "/queue/a:b", version)
    wire = message_frame(prefix, "s-7", 3, True, ack, b"body\0with nul")
    headers = {"subscription": "sub:1", "destination": "/queue/a:b", "message-id": "s-7",
               "delivery-count": "3", "redelivered": "true"}
    if ack:
        headers["ack"] = "s-7"
    expected = encode("MESSAGE", headers, b"body\0with nul", version)
    (fast,) = parse_all(wire, version=version)
    (slow,) = parse_all(expected, version=version)
    assert fast == slow
