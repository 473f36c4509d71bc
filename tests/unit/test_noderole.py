"""Which role a node's Redis starts in (gearhorn/supervision/noderole.py):
never an empty master, and a first start that agrees on one."""

from __future__ import annotations

import pytest

from gearhorn.supervision.noderole import (
    CANDIDATE,
    MASTER,
    REPLICA,
    WAIT,
    Candidate,
    Seen,
    decide,
)

pytestmark = pytest.mark.timeout(10)

A, B, C = "10.0.0.2", "10.0.0.3", "10.0.0.4"


def test_a_node_whose_sentinels_name_another_master_follows_it_data_or_not():
    for has_data in (True, False):
        assert decide(B, Seen(named=A, has_data=has_data)).master == A
        assert decide(B, Seen(named=A, has_data=has_data)).role == REPLICA


def test_a_node_still_named_the_master_leads_only_if_its_data_came_back():
    assert decide(A, Seen(named=A, has_data=True)).role == MASTER
    waiting = decide(A, Seen(named=A, has_data=False))
    assert waiting.role == WAIT and "promote a replica" in waiting.reason


def test_with_no_sentinel_a_node_starts_as_a_candidate_then_waits_for_a_majority():
    assert decide(A, Seen(named=None, has_data=False)).role == CANDIDATE
    alone = decide(A, Seen(None, False, {A: Candidate("master", 0)}))
    assert alone.role == WAIT and "majority" in alone.reason


def test_the_candidate_with_the_most_keys_leads_a_first_start():
    """After every node was down, the one that came back with data leads,
    whatever its address: an empty first node must not wipe the others."""
    seen = Seen(None, False, {A: Candidate("master", 0), C: Candidate("master", 120)})
    assert decide(A, seen).role == REPLICA and decide(A, seen).master == C
    assert decide(C, Seen(None, True, seen.candidates)).role == MASTER


def test_among_empty_candidates_the_first_address_leads():
    seen = Seen(None, False, {B: Candidate("master", 0), A: Candidate("master", 0),
                              C: Candidate("master", 0)})
    assert [decide(n, seen).role for n in (A, B, C)] == [MASTER, REPLICA, REPLICA]
    assert {decide(n, seen).master for n in (A, B, C)} == {A}


def test_a_leader_chosen_elsewhere_is_followed():
    seen = Seen(None, False, {A: Candidate("master", 0), B: Candidate("slave", 0, A)})
    assert decide(C, seen) == decide(C, Seen(None, False, {**seen.candidates,
                                                           C: Candidate("master", 7)}))
    assert decide(C, seen).master == A
    assert decide(A, seen).role == MASTER
