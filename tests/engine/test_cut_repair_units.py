"""``cut_repair.rotation``: where the cut read's first messages stand after a cut (pure); whether a
read's later channels stand in their places (``blocks_in_place``, with ``Taken`` recording where
they began); and which management statistics sample ``returned_ready`` trusts."""

from __future__ import annotations

from rbak.backup.cut_repair import Plan, Taken, blocks_in_place, identity, reorder_plan, returned_ready, rotation


def ids(*xs: int) -> list[bytes]:
    return [b"%d" % x for x in xs]


def test_a_whole_rotation_is_found():
    # [A=3,4,5 | B=0,1,2] all returned; the cut read had recorded 0,1
    assert rotation(ids(3, 4, 5, 0, 1, 2), [True] * 6, ids(0, 1)) == 3


def test_an_unrotated_queue_is_position_zero():
    assert rotation(ids(0, 1, 2, 3), [True, True, False, False], ids(0, 1)) == 0


def test_a_match_that_reaches_past_the_returns_is_not_trusted():
    # 0 is returned, 1 never delivered: the recorded prefix cannot straddle both
    assert rotation(ids(9, 0, 1), [True, True, False], ids(0, 1)) is None


def test_duplicates_make_it_uncertain():
    assert rotation(ids(7, 7, 7, 7), [True] * 4, ids(7, 7)) is None


def test_no_match_and_no_prefix():
    assert rotation(ids(1, 2, 3), [True] * 3, ids(8)) is None
    assert rotation(ids(1, 2, 3), [True] * 3, []) is None


class Props:
    message_id = correlation_id = timestamp = None


def taken(tags: list[int]) -> Taken:
    """A cut read that took message i (body b"i") with delivery tag tags[i]."""
    t = Taken()
    for i, tag in enumerate(tags):
        t.see(i, tag, Props(), b"%d" % i)
    return t


def test_taken_records_where_each_later_channel_began():
    # channel 1 took 0..2 (tags 1,2,3, two windows share its tags), channel 2 took 3..4, channel 3 took 5
    t = taken([1, 2, 3, 1, 2, 1])
    assert t.prefix == [identity(Props(), b"%d" % i) for i in range(6)]
    assert [(start, len(first)) for start, first in t.blocks] == [(3, 2), (5, 1)]
    assert t.blocks[0][1] == [identity(Props(), b"3"), identity(Props(), b"4")]


def test_the_lead_stops_where_the_second_channel_began():
    # a first channel of 2 messages: a prefix reaching into the next channel is not kept together by a cut
    t = taken([1, 2, 1, 2, 3])
    assert t.lead() == [identity(Props(), b"0"), identity(Props(), b"1")]
    assert taken([1, 2, 3]).lead() == t.prefix[:3]


def test_one_channel_has_no_blocks_to_check():
    assert taken([1, 2, 3, 4]).blocks == []
    assert blocks_in_place(ids(2, 3, 0, 1), 2, [])


def test_channels_given_back_in_order_are_in_place():
    # B1=0,1 on channel 1, B2=2,3 on channel 2, A=8,9 not taken; after the cut: [A, B1, B2]
    blocks = [(2, ids(2, 3))]
    assert rotation(ids(8, 9, 0, 1, 2, 3), [True] * 6, ids(0, 1)) == 2
    assert blocks_in_place(ids(8, 9, 0, 1, 2, 3), 2, blocks)
    # a queue never returned before: [B2, B1] in the returns; moving B2 behind puts both back
    assert rotation(ids(2, 3, 0, 1), [True] * 4, ids(0, 1)) == 2
    assert blocks_in_place(ids(2, 3, 0, 1), 2, blocks)


def test_channels_given_back_swapped_behind_other_returns_are_not_in_place():
    # [A, B2, B1]: moving what stands ahead of B1 would give [B1, A, B2], not the original [B1, B2, A]
    seen = ids(8, 9, 2, 3, 0, 1)
    j = rotation(seen, [True] * 6, ids(0, 1))
    assert j == 4
    assert not blocks_in_place(seen, j, [(2, ids(2, 3))])


def test_a_block_the_check_read_did_not_reach_is_not_vouched_for():
    assert not blocks_in_place(ids(0, 1, 2), 0, [(2, ids(2, 3))])


def restored(seen: list[bytes], plan: Plan) -> list[bytes]:
    """What giving the planned parts back in the planned order leaves in the queue."""
    return [x for i in plan.order for x in seen[plan.segments[i][0]:plan.segments[i][1]]]


def test_a_plan_puts_swapped_channels_back_behind_the_returns_they_were_ahead_of():
    # original [B1=0,1 | B2=2,3 | B3=4,5,6 | A=8,9]; the cut left [A, B3, B1, B2]
    seen = ids(8, 9, 4, 5, 6, 0, 1, 2, 3)
    blocks = [(2, ids(2, 3)), (4, ids(4, 5))]
    j = rotation(seen, [True] * 9, ids(0, 1))
    assert j == 5 and not blocks_in_place(seen, j, blocks)
    plan = reorder_plan(seen, [True] * 9, j, blocks)
    assert plan is not None and plan.segments == [(0, 2), (2, 5), (5, 7), (7, 9)]
    assert restored(seen, plan) == ids(0, 1, 2, 3, 4, 5, 6, 8, 9)


def test_a_plan_keeps_never_delivered_messages_last():
    # one channel: [A=5,6 | B=0..4 taken, returned behind A | C=7,8 never delivered] -> [B, A, C]
    seen = ids(5, 6, 0, 1, 2, 3, 4, 7, 8)
    redelivered = [True] * 7 + [False] * 2
    plan = reorder_plan(seen, redelivered, 2, [])
    assert plan is not None and restored(seen, plan) == ids(0, 1, 2, 3, 4, 5, 6, 7, 8)


def test_a_channel_of_the_wrong_length_or_found_twice_has_no_plan():
    # B1 was 2 long, but 3 messages stand between it and B2: something else is there
    assert reorder_plan(ids(0, 1, 7, 2, 3), [True] * 5, 0, [(2, ids(2, 3))]) is None
    # B2's first identities twice
    assert reorder_plan(ids(2, 0, 1, 2), [True] * 4, 1, [(2, ids(2))]) is None


class Samples:
    """The management API's answers for one queue, one per request (the last one repeats)."""

    def __init__(self, *samples: dict) -> None:
        self.samples, self.calls = list(samples), 0

    def request(self, method: str, path: str) -> dict:
        self.calls += 1
        return self.samples.pop(0) if len(self.samples) > 1 else self.samples[0]


def sample(ready: int, unacked: int, returned: int) -> dict:
    return {"messages_ready": ready, "messages_unacknowledged": unacked, "messages_ready_returned": returned}


def test_a_sample_from_before_the_cut_read_is_waited_past():
    # statistics lag: the first answer still shows the fresh queue (12,000 ready, none returned), which
    # also has every message ready and none unacked; the cut read had taken 7,000, so it is refused
    client = Samples(sample(12_000, 0, 0), sample(5_000, 7_000, 0), sample(12_000, 0, 7_020))
    assert returned_ready(client, "v", "q", 12_000, sleep=lambda _s: None, reported=True, taken=7_000) == 7_020
    assert client.calls == 3


def test_an_older_sample_of_a_cut_inside_the_returns_is_already_right():
    # a second cut took 2,500 of the 7,020 returns: they went back behind the others, the count stays
    client = Samples(sample(12_000, 0, 7_020))
    assert returned_ready(client, "v", "q", 12_000, sleep=lambda _s: None, reported=True, taken=2_500) == 7_020


def test_no_trustworthy_sample_in_time_is_none():
    client = Samples(sample(12_000, 0, 0))
    assert returned_ready(client, "v", "q", 12_000, wait_secs=0, sleep=lambda _s: None, reported=True,
                          taken=7_000) is None
