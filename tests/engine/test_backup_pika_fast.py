"""The reading connections' callback check answers exactly as pika's own, for every frame."""

from __future__ import annotations

import types

import pika.callback
import pika.connection
import pika.frame
import pika.spec

from rbak.broker import pika_fast


class FakeConnection:
    def __init__(self):
        self.callbacks = pika.callback.CallbackManager()


METHODS = [pika.spec.Basic.Deliver("c", 1, False, "", "q"), pika.spec.Basic.ConsumeOk("c"),
           pika.spec.Basic.CancelOk("c"), pika.spec.Channel.CloseOk(), pika.spec.Basic.Cancel("c"),
           pika.spec.Basic.QosOk(), pika.spec.Queue.DeclareOk("q", 3, 0)]


def test_same_answer_as_pika_with_and_without_registered_callbacks():
    conn = FakeConnection()
    cb = conn.callbacks
    cb.add(1, pika.spec.Basic.ConsumeOk, lambda *a: None)
    cb.add(1, pika.spec.Basic.ConsumeOk, lambda *a: None, one_shot=False)
    cb.add(2, pika.spec.Channel.CloseOk, lambda *a: None)
    cb.add(0, pika.spec.Basic.Deliver, lambda *a: None)  # whatever is registered, both see it
    answers = []
    for ch in (0, 1, 2, 3, 65535):
        for m in METHODS:
            f = pika.frame.Method(ch, m)
            theirs = pika.connection.Connection._has_pending_callbacks(conn, f)
            ours = pika_fast.has_pending_callbacks(conn, f)
            assert ours == theirs, (ch, m.NAME)
            answers.append(ours)
    assert {None, 1, 2} <= set(answers)  # the cases were all there


def test_install_is_per_connection_and_idempotent():
    class Impl(FakeConnection):
        def _has_pending_callbacks(self, value):
            return "pika"

    a, b = Impl(), Impl()
    pika_fast.install(a)
    pika_fast.install(a)
    f = pika.frame.Method(1, pika.spec.Basic.Deliver("c", 1, False, "", "q"))
    assert a._has_pending_callbacks(f) is None
    assert isinstance(a.__dict__["_has_pending_callbacks"], types.MethodType)
    assert b._has_pending_callbacks(f) == "pika"  # other connections and the class untouched


def test_unknown_shapes_are_left_alone():
    class Other:
        callbacks = None

    o = Other()
    pika_fast.install(o)
    assert "_has_pending_callbacks" not in o.__dict__
