"""`rbak restore` of an archive into a target that lacks its streams or its vhost (issue 48): the advice said
"restore the definitions first" / "restore with --definitions", which an archive cannot do (it stores none, and
--definitions is refused for it). It says what an archive's user can do instead."""

from __future__ import annotations

import json

import pytest
from support.backups import fast_publish
from support.brokers import unique_name, wait_until
from support.archives import Archiver, archive_config, bodies, declare_stream, fs_storage, generations, rbak


def test_a_missing_stream_or_vhost_gets_advice_an_archive_can_follow(rmq43, vhost_factory, tmp_path):
    broker = rmq43
    vhost, fresh = vhost_factory(broker), vhost_factory(broker)
    declare_stream(broker, vhost, "s")
    fast_publish(broker, vhost, "s", [b"s-%d" % i for i in range(10)])
    path = str(tmp_path / "store")
    arc = Archiver(archive_config(tmp_path, broker, vhost, fs_storage(tmp_path)), tmp_path / "a.log").running()
    wait_until(lambda: sum(g["total_messages"] for g in generations(path)) == 10, timeout=120, what="archived")
    arc.stop()

    def restore(target_vhost: str):
        return rbak("restore", "--path", path, "--archive", "arc", "--target-url", broker.amqp_url(target_vhost),
                    "--management-url", broker.management_url, check=False)

    r = restore(fresh)  # the vhost is there, its stream is not
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines()[-1] == (
        f"rbak: Restore error: 1 queue(s) failed, first queue 's' in vhost {vhost!r}: queue 's' in vhost {fresh!r} "
        "does not exist (archive 'arc' stores no definitions: declare it (x-queue-type: stream, with the source "
        "stream's retention arguments), or import a definitions export taken by rbak backup or rbak "
        f"definitions-export, then restore again); it is the target of queue 's' in vhost {vhost!r}"), r.stderr
    assert "definitions first" not in r.stderr and "--definitions" not in r.stderr

    missing = unique_name("test-nowhere")
    r = restore(missing)
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines()[-1] == (
        f"rbak: Restore error: target vhost {missing!r} does not exist on {broker.management_url} (or user "
        f"{broker.user!r} cannot see it); nothing was published: create it and declare its streams there (archive "
        "'arc' stores no definitions to restore; a definitions export taken by rbak backup or rbak "
        f"definitions-export can be imported instead), or map vhost {vhost!r} elsewhere"), r.stderr

    declare_stream(broker, fresh, "s")  # as the advice says: then the restore goes through
    assert restore(fresh).returncode == 0
    wait_until(lambda: bodies(broker, fresh, "s") == [b"s-%d" % i for i in range(10)], timeout=30,
               what="the restored stream read back")


@pytest.mark.parametrize("which", ["rmq43", "rmq310"])
def test_a_tap_restore_refuses_targets_it_cannot_verify_before_publishing(request, which, vhost_factory, tmp_path):
    """A new user's trial of queue taps (4.3.6; 3.10.8 too): a tap goes into a queue of the type it recorded.
    The advice for a missing target said "x-queue-type: stream"; following it, the restore published into
    streams named qq/cq and then failed on their depth (0) after the confirms. The dry run said "would
    publish 3" where the real run failed; ``types: [quorum, classic]`` selected nothing without saying why;
    a management URL of another broker exited 1 where configuration errors exit 2."""
    broker, other = request.getfixturevalue(which), request.getfixturevalue("rmq310" if which == "rmq43" else "rmq43")
    vhost, fresh = vhost_factory(broker), vhost_factory(broker)
    broker.api("PUT", f"/api/exchanges/{vhost}/orders", json={"type": "direct", "durable": True})
    broker.declare_queue(vhost, "qq", arguments={"x-queue-type": "quorum"})
    broker.declare_queue(vhost, "cq")
    for q in ("qq", "cq"):
        broker.api("POST", f"/api/bindings/{vhost}/e/orders/q/{q}", json={"routing_key": q, "arguments": {}})
    store, path = fs_storage(tmp_path), str(tmp_path / "store")
    arc = Archiver(archive_config(tmp_path, broker, vhost, store, taps={"include": ["qq", "cq"]}),
                   tmp_path / "a.log").running()
    want = {q: [b"%s-%d" % (q.encode(), i) for i in range(3)] for q in ("qq", "cq")}
    for q, bs in want.items():
        broker.publish(vhost, "", bs, exchange="orders", routing_key=q)
    wait_until(lambda: sum(g["total_messages"] for g in generations(path)) == 6, timeout=120, what="archived")
    arc.stop()

    def restore(*extra: str, mgmt: str = broker.management_url, config: dict | None = None):
        args = ["--path", path, "--archive", "arc", "--pitr-end", "recoverable", "--target-url",
                broker.amqp_url(fresh), "--management-url", mgmt]
        if config is not None:
            cfg = tmp_path / "restore.yaml"
            cfg.write_text(json.dumps({"mode": "restore", "storage": json.loads(store), "restore": config,
                                       "target": {"amqp_url": broker.amqp_url(fresh), "management_url": mgmt}}))
            args = ["--config", str(cfg), "--archive", "arc", "--pitr-end", "recoverable"]
        return rbak("restore", *args, *extra, check=False)

    def last(r, code: int) -> str:
        assert r.returncode == code, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
        return r.stderr.splitlines()[-1]

    advice = ("does not exist (archive 'arc' stores no definitions: declare {t} queue {q!r}, as tap 'rbak.tap.{q}' "
              "recorded queue {q!r}, or import a definitions export taken by rbak backup or rbak definitions-export, "
              "then restore again); it is the target of queue 'rbak.tap.{q}' in vhost {v!r}")
    missing = {q: f"queue {q!r} in vhost {fresh!r} " + advice.format(t=t, q=q, v=vhost)
               for q, t in (("qq", "quorum"), ("cq", "classic"))}
    for extra in (("--dry-run",), ()):  # 1, 3: the dry run says what the real run fails with, and exits as it does
        r = restore(*extra)
        assert last(r, 1) == (f"rbak: Restore error: 2 queue(s) failed, first queue 'rbak.tap.cq' in vhost {vhost!r}: "
                              f"{missing['cq']}"), r.stderr  # the manifest lists the queues by name
        for q in ("qq", "cq"):
            assert f"{vhost}/rbak.tap.{q} -> {fresh}/{q}: failed, " in r.stdout and missing[q] in r.stdout, r.stdout

    for q in ("qq", "cq"):  # 2: the wrong advice followed: refused before anything is published, dry run or not
        declare_stream(broker, fresh, q)
    wrong = ("queue {q!r} in vhost {f!r} is a stream, but tap 'rbak.tap.{q}' of {t} queue {q!r} in vhost {v!r} is "
             "restored into it as a {t} queue: declare it as a {t} queue (x-queue-type: {t}) in its place, or restore "
             "the tap into this stream as the stream it is archived as, with restore.queue_mapping "
             "('{v}/rbak.tap.{q}': {q!r}) in a restore config")
    for extra in (("--dry-run",), ()):  # every tap named at once
        assert last(restore(*extra), 1) == (
            "rbak: Restore error: nothing was published: " + wrong.format(q="cq", t="classic", f=fresh, v=vhost)
            + "; " + wrong.format(q="qq", t="quorum", f=fresh, v=vhost))
    assert bodies(broker, fresh, "qq") == [] and bodies(broker, fresh, "cq") == []
    # the way out, as the refusal gives it: the tap mapped onto the stream goes into it, verified as a stream
    r = restore(config={"queue_mapping": {f"{vhost}/rbak.tap.qq": "qq"}, "queues": {"include": ["rbak.tap.qq"]}})
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"{vhost}/rbak.tap.qq -> {fresh}/qq: restored, confirmed 3" in r.stdout, r.stdout
    assert bodies(broker, fresh, "qq") == want["qq"]

    # 4: types select by the archived type (stream); the refusal says how to select a tap
    assert last(restore(config={"queues": {"types": ["quorum", "classic"]}}), 2) == (
        f"rbak: Configuration error: restore.queues: selects none of the 2 queue(s) of backup "
        f"{generations(path)[-1]['backup_id']!r} (types ['quorum', 'classic'], min_messages 0, exclude []); taps are "
        "archived as streams: 'rbak.tap.cq' taps classic queue 'cq', 'rbak.tap.qq' taps quorum queue 'qq'; select "
        f"them by name or with types: [stream]; its queues: '{vhost}/rbak.tap.cq', '{vhost}/rbak.tap.qq'")

    # 5: the management API of another broker is a configuration error
    msg = last(restore(mgmt=other.management_url), 2)
    assert msg.startswith(f"rbak: Configuration error: target.management_url {other.management_url} answers for "
                          "cluster") and msg.endswith("; nothing was restored"), msg

    for q in ("qq", "cq"):
        broker.delete_queue(fresh, q)
    broker.declare_queue(fresh, "qq", arguments={"x-queue-type": "quorum"})
    broker.declare_queue(fresh, "cq", arguments={"x-queue-type": "quorum"})  # the classic one migrated: taken
    r = restore()  # as the advice says: then the restore goes through
    assert r.returncode == 0, r.stderr[-3000:]
    assert [m.body for m in broker.drain_queue(fresh, "qq")] == want["qq"]
    assert [m.body for m in broker.drain_queue(fresh, "cq")] == want["cq"]
