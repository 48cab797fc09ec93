"""``cut_repair.rotation``: where the cut read's first messages stand after a cut (pure); and which
management statistics sample ``returned_ready`` trusts."""

from __future__ import annotations

from rbak.backup.cut_repair import returned_ready, rotation


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
