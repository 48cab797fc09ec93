"""Put on PYTHONPATH of one subprocess only: its wall clock runs ``RBAK_TEST_CLOCK_AHEAD`` seconds ahead
(time.time, time.time_ns, datetime.now), as if the import ran that much later. Never in the test process."""

import os

_ahead = float(os.environ.get("RBAK_TEST_CLOCK_AHEAD") or 0)
if _ahead:
    import datetime as _dt
    import time as _time

    _real_time, _real_time_ns = _time.time, _time.time_ns
    _time.time = lambda: _real_time() + _ahead
    _time.time_ns = lambda: _real_time_ns() + int(_ahead * 1e9)

    class _AheadDatetime(_dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return super().now(tz) + _dt.timedelta(seconds=_ahead)

        @classmethod
        def utcnow(cls):
            return super().utcnow() + _dt.timedelta(seconds=_ahead)

    _dt.datetime = _AheadDatetime
