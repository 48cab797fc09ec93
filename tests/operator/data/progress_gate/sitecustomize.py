"""Loaded by the Job pods of the progress end-to-end tests (``PodRunner.extra_env`` puts this
directory on PYTHONPATH): the run is held after its first finished queue until the test creates the
file ``$RBAK_TEST_PROGRESS_GATE`` (it writes ``<gate>.reached`` when it got there). The progress
reporter keeps running meanwhile, so the test sees a Job that is deterministically mid-run."""

import os
import time

_gate = os.environ.get("RBAK_TEST_PROGRESS_GATE")
if _gate:
    import rbak.repo.progress as _p

    _orig = _p.Tracker.finish_queue

    def _finish_queue(self, label):
        _orig(self, label)
        if self.queues_done == 1 and self.kind in ("backup", "restore"):
            with open(_gate + "." + self.kind + ".reached", "w") as f:
                f.write(self.run_id)
            while not os.path.exists(_gate):
                time.sleep(0.05)

    _p.Tracker.finish_queue = _finish_queue
