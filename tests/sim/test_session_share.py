"""benchmarks/simlib/session_share.py: per-turn work, whole-session packing, online placement."""

from types import SimpleNamespace

import pytest

from benchmarks.simlib import session_share as ss


def rec(request_id, arrival_s, prompt, output):
    return SimpleNamespace(request_id=request_id, arrival_s=arrival_s,
                           num_prompt_tokens=prompt, num_output_tokens=output)


def test_turn_work_is_the_new_prompt_tokens_and_the_answer():
    records = [rec("cv-s1-t1", 30.0, 100 + 40 + 25, 10), rec("cv-s1-t0", 0.0, 100, 40),
               rec("cv-s2-t0", 10.0, 60, 5)]
    turns = ss.turns_of(records)
    assert turns == [ss.Turn(0.0, "s1", 140, 0), ss.Turn(10.0, "s2", 65, 0),
                     ss.Turn(30.0, "s1", 35, 140)]
    assert ss.session_work(turns) == {"s1": 175, "s2": 65}


def test_only_conversation_ids_are_accepted():
    with pytest.raises(ValueError, match="not a conversation turn id"):
        ss.session_of("sha-3")


def test_offline_packing_finds_the_even_split_that_longest_first_misses():
    # longest first: [3, 2, 2] [3, 2] (7 / 5); a swap of a 3 and a 2 makes it 6 / 6
    assert sorted(ss.pack_offline([3, 3, 2, 2, 2], 2)) == [6, 6]
    assert sorted(ss.pack_offline([8, 7, 6, 5, 4], 3)) == [8, 11, 11]  # 10 each is not whole
    assert ss.pack_offline([9, 1], 2) == [1, 9]  # one item cannot be split


def test_online_placement_without_and_with_moves():
    # s0 (long) and s1 start together; s2 starts once s0 has grown: least work puts it on r1
    turns = [ss.Turn(0.0, "s0", 10, 0), ss.Turn(1.0, "s1", 10, 0),
             ss.Turn(2.0, "s0", 50, 10), ss.Turn(3.0, "s2", 10, 0),
             ss.Turn(4.0, "s0", 30, 60)]
    placed = ss.place_online(turns, 2)
    assert placed == ss.Placement(90 / 55, 0, 0)  # r0: 90, r1: 20
    assert ss.place_online(turns, 2, ss.round_robin) == ss.Placement(100 / 55, 0, 0)
    # at s0's last turn r0 holds 60 of 80 (over 1.2 x the mean 40): it moves to r1 and
    # recomputes its 60-token context there
    moved = ss.place_online(turns, 2, move_slack=0.2)
    assert moved == ss.Placement(110 / 85, 1, 60)  # r0: 60, r1: 20 + 60 + 30
