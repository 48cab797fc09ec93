"""Hypothesis strategies for RBAK records (shared by the codec tests)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from rbak.format.record import (
    Array, BackupProperties, BackupRecord, Bool, Bytes, Double, Float, Long, LongString, Short,
    ShortString, Table, Timestamp, Void,
)

text = st.text(max_size=20)
f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)

scalars = st.one_of(
    text.map(LongString), text.map(ShortString),
    st.integers(-(2**63), 2**63 - 1).map(Long), st.integers(-(2**15), 2**15 - 1).map(Short),
    st.booleans().map(Bool), st.binary(max_size=16).map(Bytes),
    st.integers(0, 2**63 - 1).map(Timestamp),
    f32.map(Float), st.floats(allow_nan=False, allow_infinity=False).map(Double), st.just(Void()),
)
header_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(st.tuples(text, inner), max_size=3).map(lambda xs: Table(tuple(xs))),
        st.lists(inner, max_size=3).map(lambda xs: Array(tuple(xs))),
    ),
    max_leaves=8,
)
opt_text = st.none() | text
properties = st.builds(
    BackupProperties,
    content_type=opt_text, content_encoding=opt_text, delivery_mode=st.none() | st.sampled_from([1, 2]),
    priority=st.none() | st.integers(0, 255), correlation_id=opt_text, reply_to=opt_text,
    expiration=opt_text, message_id=opt_text, timestamp=st.none() | st.integers(0, 2**40),
    type_field=opt_text, user_id=opt_text, app_id=opt_text, cluster_id=opt_text,
)
records = st.builds(
    BackupRecord,
    body=st.binary(max_size=300),
    properties=properties,
    headers=st.lists(st.tuples(text, header_values), max_size=4).map(tuple),
    exchange=text, routing_key=text, delivery_tag=st.integers(0, 2**63),
    redelivered=st.booleans(), backed_up_at=st.integers(0, 2**45),
    source_queue=text, source_vhost=text,
)


def f32_round(x: float) -> float:
    return float(np.float32(x)) if math.isfinite(x) else x
