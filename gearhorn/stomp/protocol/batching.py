"""SEND frames read together, grouped for one round trip each: pure, no I/O.

Consecutive plain SENDs (no headers that change how a message travels, no
transaction) to one ``/queue/`` or non-wildcard ``/topic/`` go to Gearman as
one batch, in order; each is still answered with its own receipt.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from gearhorn.rules.messages import MAX_BATCH
from gearhorn.stomp.protocol.frames import Frame
from gearhorn.stomp.protocol.rules import plain


def send_batches(frames: Iterable[Frame], max_bytes: int) -> Iterator[list[Frame]]:
    """``frames`` in order, in groups: a batch of SENDs (at most
    ``MAX_BATCH`` frames and ``max_bytes`` of bodies), or any other frame alone."""
    batch: list[Frame] = []
    size = 0
    for frame in frames:
        if batch and _joins(batch, size, frame, max_bytes):
            batch.append(frame)
            size += len(frame.body)
            continue
        if batch:
            yield batch
            batch, size = [], 0
        if _batchable(frame):
            batch, size = [frame], len(frame.body)
        else:
            yield [frame]
    if batch:
        yield batch


def _batchable(frame: Frame) -> bool:
    if frame.command != "SEND" or "transaction" in frame.headers or not plain(frame):
        return False
    dest = frame.headers.get("destination", "")
    return dest.startswith(("/queue/", "/topic/")) and not dest.endswith("*")


def _joins(batch: list[Frame], size: int, frame: Frame, max_bytes: int) -> bool:
    return (len(batch) < MAX_BATCH and _batchable(frame)
            and frame.headers["destination"] == batch[0].headers["destination"]
            and size + len(frame.body) <= max_bytes)
