"""A restore's status says what happened (issue 44), on the real API server with the local kubelet: the
messages the target confirmed (not the backup's total), the published count, the target vhosts and
queues, and whether it was a dry run; the printer columns show them."""

from __future__ import annotations

import re

import pytest

from support.op_e2e import API, create_backup, trigger, wait_run
from support.opcluster import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]


def _restore(cluster, rname: str, **spec) -> dict:
    cluster.http.create(API, "rabbitmqrestores", {"apiVersion": API, "kind": "RabbitMQRestore",
                                                  "metadata": {"name": rname}, "spec": spec})
    return wait_for(lambda: (s := (cluster.http.get(API, "rabbitmqrestores", rname) or {}).get("status") or {})
                    .get("phase") in ("Succeeded", "Failed") and s, 120, what=rname, diag=cluster.logs)


def test_restore_status_counts_what_was_confirmed(cluster, env):
    orders = [f"o-{i}".encode() for i in range(6)]
    other = [f"x-{i}".encode() for i in range(4)]
    env.broker.publish(env.vhost, "orders", orders, declare={})
    env.broker.publish(env.vhost, "other", other, declare={})
    name = f"{env.tag}-rs"
    create_backup(cluster, env, name)
    trigger(cluster, name, "1")
    bid = wait_run(cluster, name, phase="Succeeded", timeout=120)["backupId"]
    env.broker.drain_queue(env.vhost, "orders")
    env.broker.drain_queue(env.vhost, "other")
    ref = {"name": name, "backupId": bid}

    dry = _restore(cluster, f"{env.tag}-dry", backupRef=ref, dryRun=True)
    assert dry["phase"] == "Succeeded", (dry, cluster.logs())
    assert (dry["dryRun"], dry["messages"], dry["publishedMessages"], dry["wouldPublish"]) == (True, 0, 0, 10), dry
    assert dry["targetQueues"] == [f"{env.vhost}/orders", f"{env.vhost}/other"] and dry["targetVhosts"] == [env.vhost]
    assert dry["backupMessages"] == 10
    assert env.broker.message_count(env.vhost, "orders") == 0 == env.broker.message_count(env.vhost, "other")

    empty = _restore(cluster, f"{env.tag}-pitr", backupRef=ref,
                     pitr={"start": "2000-01-01T00:00:00Z", "end": "2000-01-02T00:00:00Z"})
    assert empty["phase"] == "Succeeded" and empty["dryRun"] is False, (empty, cluster.logs())
    assert (empty["messages"], empty["publishedMessages"], empty["confirmedMessages"]) == (0, 0, 0), empty

    some = _restore(cluster, f"{env.tag}-some", backupRef=ref, queues={"include": ["orders"]})
    assert some["phase"] == "Succeeded", (some, cluster.logs())
    assert (some["messages"], some["publishedMessages"], some["confirmedMessages"]) == (6, 6, 6), some
    assert some["targetQueues"] == [f"{env.vhost}/orders"]
    assert env.broker.read_bodies(env.vhost, "orders") == orders and env.broker.message_count(env.vhost, "other") == 0
    ev = wait_for(lambda: [e for e in cluster.events(f"{env.tag}-some") if e["reason"] == "RestoreSucceeded"], 30,
                  what="event")
    assert f"6 messages restored (published 6, confirmed 6) to {env.vhost}/orders" in ev[0]["message"], ev

    # the columns a user sees: restored counts and dry run, not the backup's total
    out = cluster.emu.kube.kubectl("-n", cluster.http.ns, "get", "rabbitmqrestores", f"{env.tag}-dry",
                                   f"{env.tag}-some", "-o", "wide").stdout
    head, *rows = [re.split(r"\s{3,}", ln.strip()) for ln in out.splitlines()]
    got = {r[0]: dict(zip(head, r)) for r in rows}
    assert (got[f"{env.tag}-dry"]["RESTORED"], got[f"{env.tag}-dry"]["DRY-RUN"]) == ("0", "true"), out
    assert (got[f"{env.tag}-some"]["RESTORED"], got[f"{env.tag}-some"]["DRY-RUN"]) == ("6", "false"), out
    assert got[f"{env.tag}-some"]["TARGET"] == f'["{env.vhost}"]', out
