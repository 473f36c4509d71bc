"""The count-first live audit's pure parts: the writers' counts, the books
that balance them, and the closer look that names what they miss."""

import pytest

from gearhorn.pipeline import closer
from gearhorn.pipeline.balance import LOOK_DUPLICATES, LOOK_MISSING, Books, Look
from gearhorn.rules.auditcounts import BUCKET_MS, Count, Counts, parse

pytestmark = pytest.mark.timeout(60)

DEADLINE, LATENESS = 10_000, 2_000
T0 = 1_000 * BUCKET_MS  # a bucket's start


def books():
    return Books(DEADLINE, LATENESS, floor=T0 // BUCKET_MS)


def counted(*calls):
    counts = Counts()
    for name, *args in calls:
        getattr(counts, name)(*args)
    return list(parse("\n".join(counts.take())))


def test_counts_are_summed_per_kind_queue_and_bucket_and_read_back():
    lines = counted(("enqueued", "t_a", 7), ("enqueued", "t_a", 7), ("enqueued", "t_b", 7),
                    ("settled", "t_a", 7, T0), ("settled", "t_a", None, T0 + 1),
                    ("streamed", "t_s", "ep:1-5", T0))
    assert sorted(lines) == sorted([
        Count("e", 7, "t_a", 2), Count("e", 7, "t_b", 1), Count("s", 7, "t_a", 1),
        Count("u", T0 // BUCKET_MS, "t_a", 1), Count("r", T0, "t_s", span="ep:1-5")])


def test_malformed_count_lines_are_skipped():
    assert list(parse("e\t1\tq\t2\nx\t1\tq\t2\ne\tone\tq\t2\ne\t1\tq\n\n")) == [
        Count("e", 1, "q", 2)]


def test_a_take_leaves_what_is_counted_meanwhile():
    counts = Counts()
    counts.enqueued("q", 1)
    assert counts.take() == ["e\t1\tq\t1"]
    assert counts.take() == [] and len(counts) == 0


def due_clock(bucket_start):
    return bucket_start + BUCKET_MS + DEADLINE + LATENESS


def test_a_bucket_whose_copies_are_all_settled_needs_no_closer_look():
    b = books()
    bucket = T0 // BUCKET_MS
    b.add([Count("e", bucket, "t_a", 3)], T0)
    b.add([Count("s", bucket, "t_a", 3)], T0 + 100)
    assert b.judge(due_clock(T0) - 1) == [] and b.open_rows() == 1  # not due yet
    assert b.judge(due_clock(T0)) == [] and b.open_rows() == 0


def test_a_short_bucket_whose_subscriber_settled_later_copies_is_looked_at():
    b = books()
    bucket = T0 // BUCKET_MS
    b.add([Count("e", bucket, "t_a", 3), Count("s", bucket, "t_a", 2)], T0 + 100)
    b.add([Count("e", bucket + 1, "t_a", 1), Count("s", bucket + 1, "t_a", 1)],
          T0 + BUCKET_MS + 100)
    assert b.judge(due_clock(T0)) == [Look(LOOK_MISSING, "t_a", T0, T0 + BUCKET_MS, 1)]
    assert b.judge(due_clock(T0) + BUCKET_MS) == []  # found once


def test_an_away_subscriber_is_no_finding_until_it_takes_a_newer_copy():
    """docs/pipeline.rst: a passed-over copy is not a finding until the
    subscriber takes another; a backlog lost while it was away for twice the
    deadline is looked at once it takes a newer copy."""
    b = books()
    bucket = T0 // BUCKET_MS
    for n in range(6):  # copies made for 30 s, none taken
        b.add([Count("e", bucket + n, "t_a", 2)], T0 + n * BUCKET_MS)
    far = T0 + 2 * DEADLINE + 6 * BUCKET_MS
    assert b.judge(far) == [] and b.away == 12
    assert b.open_rows() <= 2  # the away buckets are one span
    b.add([Count("e", bucket + 10, "t_a", 1), Count("s", bucket + 10, "t_a", 1)], far)
    looks = b.judge(far + 1)
    assert looks == [Look(LOOK_MISSING, "t_a", T0, T0 + 6 * BUCKET_MS, 12)]


def test_an_away_subscriber_back_at_its_old_copies_settles_them_without_a_look():
    b = books()
    bucket = T0 // BUCKET_MS
    b.add([Count("e", bucket, "t_a", 2)], T0)
    assert b.judge(due_clock(T0)) == [] and b.away == 2
    b.add([Count("s", bucket, "t_a", 2)], due_clock(T0) + 1000)
    b.add([Count("e", bucket + 10, "t_a", 1), Count("s", bucket + 10, "t_a", 1)],
          due_clock(T0) + 1000)
    assert b.judge(due_clock(T0) + 2000) == []
    assert b.open_rows() == 1  # the newer bucket, not due yet


def test_settlements_of_unknown_bucket_make_up_the_oldest_short_buckets():
    b = books()
    bucket = T0 // BUCKET_MS
    b.add([Count("e", bucket, "t_a", 3), Count("s", bucket, "t_a", 1),
           Count("e", bucket + 1, "t_a", 2), Count("s", bucket + 1, "t_a", 2)], T0 + 100)
    b.add([Count("u", bucket + 1, "t_a", 2)], T0 + BUCKET_MS + 10)  # a drop, a taker's answer
    assert b.judge(due_clock(T0 + BUCKET_MS)) == []


def test_settlements_left_over_are_looked_at_for_duplicates():
    b = books()
    bucket = T0 // BUCKET_MS
    b.add([Count("e", bucket, "t_a", 2), Count("s", bucket, "t_a", 2)], T0 + 100)
    b.add([Count("u", bucket + 1, "t_a", 1)], T0 + BUCKET_MS)
    looks = b.judge(due_clock(T0))
    assert [(lk.kind, lk.queue, lk.short) for lk in looks] == [(LOOK_DUPLICATES, "t_a", 1)]


def test_buckets_before_the_first_start_and_late_counts_are_not_judged():
    b = books()
    bucket = T0 // BUCKET_MS
    b.add([Count("s", bucket - 1, "t_a", 5)], T0)  # copies made before it started
    assert b.judge(due_clock(T0)) == [] and b.open_rows() == 0


def test_books_survive_a_save():
    b = books()
    bucket = T0 // BUCKET_MS
    b.add([Count("e", bucket, "t_a", 3), Count("s", bucket, "t_a", 1)], T0 + 6000)
    again = Books.from_json(b.to_json(), DEADLINE, LATENESS)
    assert again.judge(due_clock(T0)) == b.judge(due_clock(T0))


def enqueued(unique, ts, queue="t_a", message_id=None):
    return {"event": "enqueued", "ts": ts, "subscriber": queue, "unique": unique,
            "message_id": message_id or unique.partition(":")[0], "topic": "t",
            "reason": None, "count": None, "redelivered": False}


def settled(unique, ts, event="answered", queue="t_a", generation=0, reason="complete",
            redelivered=False, handle=None):
    return {"event": event, "ts": ts, "subscriber": queue, "unique": unique,
            "message_id": None, "topic": None, "reason": reason, "count": generation,
            "redelivered": redelivered, "handle": handle}


def test_a_closer_look_names_the_copy_passed_over_and_the_one_overdue():
    rows = [enqueued("m1:a", T0 + 10), enqueued("m2:a", T0 + 20), enqueued("m3:a", T0 + 30),
            settled("m2:a", T0 + 40), settled("m9:a", T0 + 50, event="dropped"),
            enqueued("m4:b", T0 + 10, queue="t_b"), enqueued("m5:a", T0 + BUCKET_MS + 9000)]
    grouped = closer.group(rows, {"t_a"})
    look = Look(LOOK_MISSING, "t_a", T0, T0 + BUCKET_MS, 2)
    found, _ = closer.findings(look, grouped["t_a"], due_clock(T0), DEADLINE, LATENESS)
    assert [(f.kind, f.message_id, f.subscriber, f.unique) for f in found] == [
        ("never_delivered", "m1", "t_a", "m1:a"), ("overdue", "m3", "t_a", "m3:a")]


def test_a_closer_look_finds_a_held_copy_completed_in_two_runs():
    """Two generations, or one under two job handles (made again at a
    taker's attach); not one job two holders heard end, nor a redelivery."""
    rows = [enqueued("m1:a", T0), settled("m1:a", T0 + 5, generation=0),
            settled("m1:a", T0 + 9, generation=1), enqueued("m2:a", T0),
            settled("m2:a", T0 + 5, generation=0, handle="H:g:1"),
            settled("m2:a", T0 + 6, generation=0, handle="H:g:1"),
            settled("m3:a", T0 + 5, event="delivered"),
            settled("m3:a", T0 + 6, event="delivered", redelivered=True),
            enqueued("m4:a", T0), settled("m4:a", T0 + 5, generation=0, handle="H:g:2"),
            settled("m4:a", T0 + 7, generation=0, handle="H:g:9")]
    grouped = closer.group(rows, {"t_a"})
    look = Look(LOOK_DUPLICATES, "t_a", T0 - DEADLINE, T0 + 10, 1)
    found, _ = closer.findings(look, grouped["t_a"], due_clock(T0), DEADLINE, LATENESS)
    assert [(f.kind, f.message_id, f.unique) for f in found] == [
        ("duplicate", "m1", "m1:a"), ("duplicate", "m4", "m4:a")]


def test_copies_a_closer_look_found_away_are_looked_at_again_once_their_subscriber_settles():
    b = books()
    bucket = T0 // BUCKET_MS
    look = Look(LOOK_MISSING, "t_a", T0, T0 + BUCKET_MS, 1)
    b.reopen(look, 1, T0 + 20_000)  # unsettled, and nothing settled after it
    assert b.judge(T0 + 21_000) == [] and b.away == 1
    b.add([Count("e", bucket + 5, "t_a", 1), Count("s", bucket + 5, "t_a", 1)], T0 + 22_000)
    assert b.judge(T0 + 23_000) == [look]
