"""StorageProgress: the resume point a restarted Spark restore computes (no Spark, no broker)."""

from __future__ import annotations

import pytest

from rbak.errors import CheckpointError
from rbak.format.layout import BackupLayout
from rbak.storage import open_storage
from rbak_spark.progress import StorageProgress, reset_progress

FP = {"backup_id": "b", "window": [None, None]}


def progress(storage, seqs, whole=True, fp=FP):
    return StorageProgress(storage, BackupLayout("b"), "pid", "/", "q", seqs, whole, fp)


def test_fresh_then_resume_from_the_confirmed_prefix():
    st = open_storage("memory://")
    p = progress(st, [1, 2, 3, 4])
    s = p.load("/", "q")
    assert (s.initial_depth, s.confirmed, s.done, s.segments) == (None, 0, False, {})
    p.start_queue("/", "q", "v", "q", 7)
    p.record("/", "q", 1, 20, False, 20)
    p.record("/", "q", 3, 5, False, 125)  # segment 2 finished between two commits: never recorded itself
    s = progress(st, [1, 2, 3, 4]).load("/", "q")
    assert s.initial_depth == 7 and s.confirmed == 125 and not s.done
    assert s.resume_point() == (3, 5)  # not (1, 20): that would publish 105 records twice
    p.finish_queue("/", "q")
    assert progress(st, [1, 2, 3, 4]).load("/", "q").done


def test_split_runs_merge_but_never_skip_past_a_gap():
    st = open_storage("memory://")
    a, b = progress(st, [1, 2], whole=False), progress(st, [3, 4], whole=False)
    a.load("/", "q"), b.load("/", "q")
    a.record("/", "q", 1, 10, False, 10)  # run A: segment 1 partly confirmed
    b.record("/", "q", 4, 3, False, 60)  # run B: segment 3 done, 4 partly
    # restarted with one run over everything: resume inside segment 1 (3 and 4 are republished, nothing lost)
    whole = progress(st, [1, 2, 3, 4], whole=False).load("/", "q")
    assert whole.resume_point() == (1, 10) and whole.initial_depth is None
    # the same split again: each run resumes where it was
    assert progress(st, [3, 4], whole=False).load("/", "q").resume_point() == (4, 3)


def test_other_settings_are_refused_and_reset_forgets():
    st = open_storage("memory://")
    p = progress(st, [1])
    p.load("/", "q")
    p.record("/", "q", 1, 1, False, 1)
    with pytest.raises(CheckpointError, match="different settings"):
        progress(st, [1], fp={"backup_id": "b", "window": [1, 2]}).load("/", "q")
    assert reset_progress(st, BackupLayout("b"), "pid") == 1
    assert progress(st, [1]).load("/", "q").segments == {}
