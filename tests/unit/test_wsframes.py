"""A client's WebSocket frames read without I/O (gearhorn/stomp/transport/wsframes.py):
the payloads wsproto's client frames carry, fed in any pieces, and every
broken frame refused with the close code RFC 6455 gives it, what came
before it kept."""

import struct

import pytest
from wsproto import ConnectionType
from wsproto.connection import Connection, ConnectionState
from wsproto.events import CloseConnection, Message, Ping

from gearhorn.stomp.transport.wsframes import (
    INVALID_DATA,
    PROTOCOL_ERROR,
    ClientFrames,
    Violation,
    close_frame,
    pong_frame,
)
from tests.fakes import chunkings

pytestmark = pytest.mark.timeout(30)


def wsproto_client() -> Connection:
    client = Connection(ConnectionType.CLIENT)
    client._state = ConnectionState.OPEN  # past the upgrade
    return client


def frame(opcode: int, payload: bytes, fin: bool = True, mask: bytes = b"\x01\x02\x03\x04",
          masked: bool = True, rsv: int = 0) -> bytes:
    """One client frame, made by hand (for the broken ones wsproto won't make)."""
    n = len(payload)
    length = (bytes([n]) if n < 126 else bytes([126]) + struct.pack("!H", n) if n < 1 << 16
              else bytes([127]) + struct.pack("!Q", n))
    head = bytes([(0x80 if fin else 0) | rsv | opcode]) + bytes([length[0] | (0x80 if masked
                                                                                else 0)])
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload)) if masked else payload
    return head + length[1:] + (mask if masked else b"") + body


def read_all(pieces) -> tuple[bytes, list[bytes], tuple | None]:
    frames, data, pings, close = ClientFrames(), [], [], None
    for piece in pieces:
        read = frames.feed(piece)
        data += read.data
        pings += read.pings
        close = read.close or close
    return b"".join(data), pings, close


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 100_000])
def test_wsprotos_masked_messages_read_back_whole_however_they_are_cut(size):
    client = wsproto_client()
    text = "SEND\ndestination:/topic/t\n\n" + "é" * (size // 2) + "x" * (size % 2) + "\0"
    wire = client.send(Message(data=text)) + client.send(Message(data=b"\xff\x00\0"))
    for pieces in chunkings(wire, splits=10):
        data, pings, close = read_all(pieces)
        assert data == text.encode() + b"\xff\x00\0"
        assert pings == [] and close is None


def test_a_fragmented_message_with_a_ping_inside_it():
    client = wsproto_client()
    wire = (client.send(Message(data="SEND\n\n", message_finished=False))
            + client.send(Ping(payload=b"are you there"))
            + client.send(Message(data="body\0", message_finished=True)))
    for pieces in chunkings(wire):
        assert read_all(pieces) == (b"SEND\n\nbody\0", [b"are you there"], None)


def test_a_character_cut_between_two_frames_is_still_utf8():
    euro = "€".encode()
    wire = frame(0x1, b"a" + euro[:1], fin=False) + frame(0x0, euro[1:] + b"\0")
    assert read_all([wire])[0] == b"a" + euro + b"\0"


def test_a_close_ends_the_reading_and_names_its_code():
    client = wsproto_client()
    wire = (client.send(Message(data="last\0")) + client.send(CloseConnection(code=1001,
                                                                              reason="bye"))
            + frame(0x1, b"after\0"))
    for pieces in chunkings(wire, splits=10):
        assert read_all(pieces) == (b"last\0", [], (1001, "bye"))
    assert read_all([frame(0x8, b"")]) == (b"", [], (1000, ""))  # no code: answered 1000


@pytest.mark.parametrize("wire, code, why", [  # after a frame "SEND\n\nok\0"
    (frame(0x1, b"x", masked=False), PROTOCOL_ERROR, "masked"),
    (frame(0x1, b"x", rsv=0x40), PROTOCOL_ERROR, "reserved bits"),
    (frame(0x0, b"x"), PROTOCOL_ERROR, "no message begun"),
    (frame(0x2, b"", fin=False) + frame(0x2, b"y"), PROTOCOL_ERROR, "before the last"),
    (frame(0x9, b"p" * 126), PROTOCOL_ERROR, "at most 125"),
    (frame(0x9, b"p", fin=False), PROTOCOL_ERROR, "must be whole"),
    (frame(0x3, b"x"), PROTOCOL_ERROR, "unknown data opcode"),
    (frame(0xB, b""), PROTOCOL_ERROR, "unknown control opcode"),
    (frame(0x1, b"\xff\xfe\0"), INVALID_DATA, "not UTF-8"),
    (frame(0x8, b"\x03"), PROTOCOL_ERROR, "one-byte code"),
    (frame(0x8, struct.pack("!H", 1005)), PROTOCOL_ERROR, "may not be sent"),
    (frame(0x8, struct.pack("!H", 1000) + b"\xff"), INVALID_DATA, "reason"),
    (b"\x81\xff" + struct.pack("!Q", 1 << 63) + b"\0\0\0\0", PROTOCOL_ERROR, "top bit"),
])
def test_a_broken_frame_is_refused_with_its_code_and_what_came_before_stands(wire, code,
                                                                             why):
    good = frame(0x1, b"SEND\n\nok\0")
    with pytest.raises(Violation, match=why) as caught:
        ClientFrames().feed(good + wire)
    assert caught.value.code == code
    assert b"".join(caught.value.read.data) == b"SEND\n\nok\0"


def test_the_servers_control_frames_are_what_wsproto_reads():
    client = wsproto_client()
    client.receive_data(pong_frame(b"hi") + close_frame(1002, "bad frame"))
    events = list(client.events())
    assert events[0].payload == b"hi"
    assert (events[1].code, events[1].reason) == (1002, "bad frame")
