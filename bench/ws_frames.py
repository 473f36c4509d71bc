"""The cost of the bridge's WebSocket frames against wsproto's, its peer,
in the same run: writing a typical MESSAGE of the load benchmark
(gearhorn/stomp/transport/websocket.py ``data_frame``), and reading a producer's
masked SEND (gearhorn/stomp/transport/wsframes.py ``ClientFrames``).

    python bench/ws_frames.py
"""

from __future__ import annotations

import timeit

from wsproto import ConnectionType
from wsproto.connection import Connection, ConnectionState
from wsproto.events import Message

from gearhorn.stomp.transport.websocket import data_frame
from gearhorn.stomp.transport.wsframes import ClientFrames

FRAME = (b"MESSAGE\nsubscription:0\nmessage-id:abc-1\ndestination:/topic/load\n"
         b"redelivered:false\n\n1700000000.123456\x00")
SEND = b"SEND\ndestination:/topic/load\n\n1700000000.123456\x00"
CALLS = 200_000


def per_call(work) -> float:
    """Microseconds per call, the best of five runs."""
    return min(timeit.repeat(work, number=CALLS, repeat=5)) / CALLS * 1e6


def main() -> None:
    wsproto = Connection(ConnectionType.SERVER)
    assert data_frame(FRAME, True) == wsproto.send(Message(data=FRAME.decode()))
    ours = per_call(lambda: data_frame(FRAME, FRAME.isascii()))
    theirs = per_call(lambda: wsproto.send(Message(data=FRAME.decode())))
    print(f"  a {len(FRAME)}-byte MESSAGE as a WebSocket frame: data_frame {ours:.2f} us, "
          f"wsproto {theirs:.2f} us (ratio {theirs / ours:.1f})")
    client = Connection(ConnectionType.CLIENT)
    client._state = ConnectionState.OPEN  # past the upgrade
    wire = client.send(Message(data=SEND.decode()))  # masked, with a random key
    reader, server = ClientFrames(), Connection(ConnectionType.SERVER)
    assert b"".join(reader.feed(wire).data) == SEND

    def by_wsproto() -> None:
        server.receive_data(wire)
        for _ in server.events():
            pass

    ours, theirs = per_call(lambda: reader.feed(wire)), per_call(by_wsproto)
    print(f"  a {len(SEND)}-byte SEND read from its masked frame: ClientFrames {ours:.2f} us, "
          f"wsproto {theirs:.2f} us (ratio {theirs / ours:.1f})")


if __name__ == "__main__":
    main()
