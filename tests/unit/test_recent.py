"""The entries a topic feed keeps for its readers that fell behind
(gearhorn/stomp/recent.py): contiguous, of one epoch, bounded."""

import pytest

from gearhorn.stomp.recent import RecentEntries


def stored(offset, size=1):
    return (offset, f"m{offset}", b"x" * size, {})


def offsets(found):
    return None if found is None else [entry[0] for entry in found]


def test_a_window_slides_over_many_entries_and_pages_are_exact():
    recent = RecentEntries(max_entries=100)
    for offset in range(1, 10_001):
        recent.add("e", stored(offset))
    assert recent.after("e", 9_899, 10) is None  # 9,900 is gone
    assert offsets(recent.after("e", 9_900, 3)) == [9_901, 9_902, 9_903]
    assert offsets(recent.after("e", 9_990, 500)) == list(range(9_991, 10_001))
    assert recent.after("e", 10_000, 5) == []
    assert len(recent._entries) <= 2 * 100  # cut as it goes


def test_a_gap_starts_the_window_again():
    recent = RecentEntries()
    for offset in (1, 2, 3, 7, 8):  # 4-6 trimmed from history before the feed read them
        recent.add("e", stored(offset))
    assert recent.after("e", 3, 10) is None  # not 7 as if it followed 3
    assert offsets(recent.after("e", 6, 10)) == [7, 8]


def test_another_epoch_is_never_answered_from_the_old_one():
    recent = RecentEntries()
    for offset in (1, 2, 3):
        recent.add("old", stored(offset))
    recent.add("new", stored(1))
    assert recent.after("old", 1, 10) is None
    assert offsets(recent.after("new", 0, 10)) == [1]
    recent.clear()
    assert recent.after("new", 0, 10) is None


@pytest.mark.parametrize("epoch", [None, "other"])
def test_a_reader_of_an_unknown_epoch_reads_redis(epoch):
    recent = RecentEntries()
    recent.add("e", stored(1))
    assert recent.after(epoch, 0, 10) is None


def test_payloads_kept_are_bounded_in_bytes_but_the_last_is_always_kept():
    recent = RecentEntries(max_entries=1_000, max_bytes=1_000)
    for offset in range(1, 21):
        recent.add("e", stored(offset, size=100))
    assert offsets(recent.after("e", 10, 100)) == list(range(11, 21))
    assert recent.after("e", 9, 100) is None
    recent.add("e", stored(21, size=5_000))  # larger than the bound alone
    assert offsets(recent.after("e", 20, 10)) == [21]
