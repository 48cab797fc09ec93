"""`rbak restore` of an archive into a target that lacks its streams or its vhost (issue 48): the advice said
"restore the definitions first" / "restore with --definitions", which an archive cannot do (it stores none, and
--definitions is refused for it). It says what an archive's user can do instead."""

from __future__ import annotations

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
