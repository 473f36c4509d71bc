"""The count-first audit's closer looks run in a thread of their own: the
rounds go on counting meanwhile, what a look finds is told once, in the
round after it ends, and a look not done when the audit dies is done after
its restart (fakeredis; the same on a real Redis in
tests/integration/test_count_audit.py)."""

import threading

import pytest

from gearhorn.pipeline import countaudit
from gearhorn.pipeline.audit import AuditSettings
from gearhorn.pipeline.countaudit import CountAudit
from gearhorn.rules.auditcounts import bucket_of
from gearhorn.store.keys import Keys
from gearhorn.store.ledger import Ledger, now_ms

pytestmark = pytest.mark.timeout(60)


def passed_over(client, keys):
    """A holder's copy m1 never settled, and m2 enqueued after it settled."""
    ledger = Ledger(client, keys, source="w", shards=1)
    for message_id in ("m1", "m2"):
        ledger.counts.enqueued("t_a", bucket_of(now_ms()))
        ledger.published("t", message_id, [("t_a", f"{message_id}:a")])
        start = now_ms()
        while now_ms() < start + 3:  # m2 enqueued after m1, by the ledger's clock
            pass
    ledger.record("answered", "t_a", "m2:a", reason="complete", generation=0)
    ledger.counts.settled("t_a", bucket_of(now_ms()), now_ms())
    ledger.flush(everything=True)


@pytest.fixture
def slow_rows(monkeypatch):
    """The ledger's rows held back until the event is set."""
    release, real = threading.Event(), countaudit.ledger_rows

    def held_back(*args):
        release.wait(30)
        return real(*args)
    monkeypatch.setattr(countaudit, "ledger_rows", held_back)
    return release


def test_rounds_go_on_while_a_look_runs_and_its_findings_are_told_once(
        fake_redis, tmp_path, slow_rows):
    keys = Keys("t:")
    passed_over(fake_redis, keys)
    settings = AuditSettings(str(tmp_path / "audit"), deadline_ms=1000, lateness_ms=500,
                             interval_s=1, from_start=True, shards=1)
    told, later = [], lambda: now_ms() + 30_000  # every bucket written is due
    audit = CountAudit(fake_redis, keys, settings, lambda s, found: told.extend(found),
                       clock=later)
    audit.begin()
    assert audit.round() and audit.looking
    for _ in range(3):  # the look waits for its rows; rounds do not wait for it
        assert audit.round() and audit.looking and told == []

    # Killed with the look undone: it is in the state saved, and runs again.
    again = CountAudit(fake_redis, keys, settings, lambda s, found: told.extend(found),
                       clock=later)
    again.round()
    assert again.looking
    slow_rows.set()
    again.wait_for_looks(30)
    again.round()
    assert [(f.kind, f.message_id) for f in told] == [("never_delivered", "m1")]
    assert not again.looking
    audit.wait_for_looks(30)  # the one before the "kill" ends too: its audit is gone
    again.round()
    assert len(told) == 1
