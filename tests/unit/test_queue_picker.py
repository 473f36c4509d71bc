"""ledgerentries.QueuePicker: the rows of a few queues, picked out of ledger
entries without parsing the rest, are exactly those rows_from_entries gives
of them (the live audit's closer look relies on it)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearhorn.rules.naming import copy_unique, queue_name
from gearhorn.store.ledgerentries import (
    BATCH,
    PUBLISHED_BATCH,
    QueuePicker,
    SharedSubscribers,
    SubscriberCopies,
    batch_entry,
    published_line,
    rows_from_entries,
)

pytestmark = pytest.mark.timeout(120)

# Names that trip a careless matcher: underscores on both sides of the
# queue's "_", regex metacharacters, one name the prefix of another.
TOPICS = ["news", "news_eu", "a.b", "x+y", "n"]
CLIENTS = ["c1", "c1_b", "eu_c1", "d-:news:dur", "(c)"]


def _batch_line(event: str, ts: int, queue: str, unique: str) -> str:
    if event == "answered":
        return f"answered\t{ts}\t{queue}\t{unique}\t0\tcomplete\t1"
    return f"{event}\t{ts}\t{queue}\t{unique}\t0"


@st.composite
def ledger(draw) -> list[tuple[str, dict[str, str]]]:
    entries = []
    for n in range(draw(st.integers(1, 6))):
        stream_id, kind = f"{1000 + n}-0", draw(st.sampled_from(["pub", "batch", "single"]))
        if kind == "pub":
            lines = []
            for m in range(draw(st.integers(1, 4))):
                topic, mid = draw(st.sampled_from(TOPICS)), f"m{n}.{m}"
                clients = draw(st.lists(st.sampled_from(CLIENTS), min_size=1, unique=True))
                if draw(st.booleans()):
                    copies = SubscriberCopies(mid, SharedSubscribers(topic, clients))
                else:
                    copies = [(queue_name(topic, c), copy_unique(mid, c)) for c in clients]
                lines.append(published_line(n, mid, topic, len(clients), copies))
            entries.append((stream_id, batch_entry(PUBLISHED_BATCH, lines, "w1")))
        elif kind == "batch":
            lines = [_batch_line(draw(st.sampled_from(["delivered", "answered", "dropped"])),
                                 n, queue_name(draw(st.sampled_from(TOPICS)),
                                               draw(st.sampled_from(CLIENTS))), f"u{n}.{m}")
                     for m in range(draw(st.integers(1, 5)))]
            entries.append((stream_id, batch_entry(BATCH, lines, "")))
        else:
            queue = queue_name(draw(st.sampled_from(TOPICS)), draw(st.sampled_from(CLIENTS)))
            entries.append((stream_id, {"e": "acked", "ts": str(n), "sub": queue,
                                        "u": f"s{n}", "mid": f"m{n}"}))
    return entries


@settings(max_examples=300, deadline=None)
@given(ledger(), st.sets(st.builds(queue_name, st.sampled_from(TOPICS),
                                   st.sampled_from(CLIENTS)), min_size=1, max_size=3))
def test_it_picks_exactly_the_queues_rows(entries, queues):
    every = [row for row in rows_from_entries(entries) if row["subscriber"] in queues]
    assert sorted(QueuePicker(queues).rows(entries), key=_order) == sorted(every, key=_order)


def _order(row: dict) -> tuple:
    return row["stream_id"], row["subscriber"], row["unique"], row["event"]


def test_a_queue_that_is_the_start_of_another_is_not_confused_with_it():
    entries = [("1-0", batch_entry(BATCH, [_batch_line("delivered", 1, "news_c1", "u1"),
                                           _batch_line("delivered", 2, "news_c1_b", "u2")], ""))]
    assert [r["unique"] for r in QueuePicker({"news_c1"}).rows(entries)] == ["u1"]


def test_no_queue_is_an_error_not_everything():
    with pytest.raises(ValueError):
        QueuePicker(set())
