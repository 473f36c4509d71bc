"""The WebSocket data frames the bridge writes itself (pure): byte for byte
what wsproto makes for the same message, at every length encoding."""

import pytest
from wsproto import ConnectionType
from wsproto.connection import Connection
from wsproto.events import Message

from gearhorn.stomp.transport.websocket import data_frame

pytestmark = pytest.mark.timeout(10)


def by_wsproto(payload: str | bytes) -> bytes:
    return Connection(ConnectionType.SERVER).send(Message(data=payload))


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 200_000])
def test_a_text_frame_is_wsprotos(size):
    payload = "MESSAGE\n\n" + "é" * (size // 2) + "x" * (size % 2)
    assert data_frame(payload.encode(), text=True) == by_wsproto(payload)


@pytest.mark.parametrize("size", [0, 125, 126, 65536])
def test_a_binary_frame_is_wsprotos(size):
    payload = bytes(range(256)) * (size // 256) + b"\xff" * (size % 256)
    assert data_frame(payload, text=False) == by_wsproto(payload)
