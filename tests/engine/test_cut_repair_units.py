"""``cut_repair.rotation``: where the cut read's first messages stand after a cut (pure)."""

from __future__ import annotations

from rbak.backup.cut_repair import rotation


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
