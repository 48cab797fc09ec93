"""RabbitMQArchive: the pure decisions (config, Deployment, status from a tick, when to write it) and one
pass against a fake API with a memory storage holding real ticks."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
import yaml
from rbak.config import Config
from rbak.errors import ConfigError
from rbak.format.archive import Tick, TickStream, tick_key
from rbak.format.manifest import StreamGap, StreamInfo
from rbak.storage.memory import MemoryStorage
from rbak_operator.decide import archive as ad
from rbak_operator.reconcile import archive as ar

T0 = 1_780_000_000_000  # ms
NOW = datetime.fromtimestamp(T0 / 1000, timezone.utc)
SPEC = {"broker": {"amqpUrl": "amqp://rabbit.ns.svc:5672/orders", "managementUrl": "http://rabbit.ns.svc:15672",
                   "credentialsSecretRef": {"name": "rmq"}},
        "queues": {"include": ["events.*"]},
        "storage": {"s3": {"bucket": "arch", "prefix": "p", "credentialsSecretRef": {"name": "s3"}}},
        "rpoSeconds": 30, "maxDelaySeconds": 5}


def owner(spec=None, name="orders") -> dict:
    return {"apiVersion": "rbak.io/v1alpha1", "kind": "RabbitMQArchive",
            "metadata": {"name": name, "namespace": "ns", "uid": "u-1", "generation": 1}, "spec": spec or SPEC}


def tick(written: int, ru: int | None, streams=None, gen="orders.20261206T080000.000Z", seq=3) -> Tick:
    streams = streams if streams is not None else [
        TickStream("orders", "events.a", StreamInfo(first_offset=0, last_offset=99), 1, ru, True),
        TickStream("orders", "events.b", StreamInfo(first_offset=0, last_offset=9), 1, ru, True)]
    return Tick("orders", gen, seq, written, T0 - 60_000, ru, streams)


def test_config_follows_the_spec_and_keeps_credentials_out():
    cfg, env = ad.archive_config(SPEC, "ns", "orders")
    assert cfg["mode"] == "archive"
    assert cfg["archive"] == {"name": "orders", "max_delay_secs": 5, "idle_tick_secs": 30}
    assert cfg["source"]["queues"] == {"include": ["events.*"], "vhosts": ["orders"]}
    assert cfg["source"]["amqp_url"] == "amqp://rabbit.ns.svc:5672/orders"
    assert cfg["storage"] == {"backend": "s3", "bucket": "arch", "region": "us-east-1", "prefix": "p"}
    assert "guest" not in yaml.safe_dump(cfg)
    assert [(e.env, e.secret, e.key) for e in env] == [
        ("RBAK_BROKER_USERNAME", "rmq", "username"), ("RBAK_BROKER_PASSWORD", "rmq", "password"),
        ("AWS_ACCESS_KEY_ID", "s3", "AWS_ACCESS_KEY_ID"), ("AWS_SECRET_ACCESS_KEY", "s3", "AWS_SECRET_ACCESS_KEY")]


def test_spec_taps_become_archive_taps_and_the_config_loads():
    spec = {**SPEC, "taps": {"include": ["orders", "payments.*"], "exclude": ["payments.dlq"], "maxAge": "2D",
                             "maxLengthBytes": 5_000_000}}
    cfg, _ = ad.archive_config(spec, "ns", "orders")
    assert cfg["archive"]["taps"] == {"include": ["orders", "payments.*"], "exclude": ["payments.dlq"],
                                      "max_age": "2D", "max_length_bytes": 5_000_000}
    taps = Config.from_dict(cfg, env={"RBAK_BROKER_USERNAME": "u", "RBAK_BROKER_PASSWORD": "p",
                                    "RBAK_STATE_DIR": "/tmp"}).archive.taps
    assert taps is not None and (taps.include, taps.max_age, taps.max_length_bytes) == (
        ["orders", "payments.*"], "2D", 5_000_000)
    assert "taps" not in ad.archive_config(SPEC, "ns", "orders")[0]["archive"]


def test_config_refuses_a_delay_over_the_objective_naming_the_fields():
    with pytest.raises(ConfigError, match=r"spec.maxDelaySeconds: 20 exceeds spec.rpoSeconds 10"):
        ad.archive_config({**SPEC, "rpoSeconds": 10, "maxDelaySeconds": 20}, "ns", "orders")
    with pytest.raises(ConfigError, match=r"spec.encryption: keyId and keysSecretRef go together"):
        ad.archive_config({**SPEC, "encryption": {"keyId": "k1"}}, "ns", "orders")


def test_deployment_one_replica_suspend_scales_to_zero_and_hash_follows_the_spec():
    cfg, env = ad.archive_config(SPEC, "ns", "orders")
    cm = ad.configmap_body(owner(), cfg)
    dep = ad.deployment_body(owner(), env, cm)
    assert dep["metadata"]["name"] == cm["metadata"]["name"] == "rbak-archive-orders"
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    assert dep["metadata"]["ownerReferences"][0]["kind"] == "RabbitMQArchive"
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["args"] == ["archive", "--config", "/etc/rbak/config.yaml", "--metrics-port", "9100"]
    assert {"name": "RBAK_BROKER_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "rmq", "key": "password"}}} in c["env"]
    sel = dep["spec"]["selector"]["matchLabels"]
    assert sel.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    suspended = ad.deployment_body(owner({**SPEC, "suspend": True}), env, cm)
    assert suspended["spec"]["replicas"] == 0
    assert ad.applied_hash(suspended) != ad.applied_hash(dep)
    cfg2, _ = ad.archive_config({**SPEC, "maxDelaySeconds": 2}, "ns", "orders")
    assert ad.applied_hash(ad.deployment_body(owner(), env, ad.configmap_body(owner(), cfg2))) != ad.applied_hash(dep)
    assert ad.applied_hash(ad.deployment_body(owner(), env, cm)) == ad.applied_hash(dep)


def test_view_of_a_current_idle_archive_meets_the_objective():
    v = ad.view(tick(T0 - 20_000, T0 - 20_400), T0, SPEC, {})  # the last idle tick 20 s ago
    assert v.lag == pytest.approx(0.4) and v.overdue == 0
    assert v.status["recoverableUntil"] == "2026-05-28T20:26:19Z" and v.status["lagSeconds"] == 1
    assert v.status["streamCount"] == 2 and v.status["gapMessages"] == 0
    assert v.status["streams"][0] == {"vhost": "orders", "name": "events.a", "epoch": 1, "present": True,
                                      "firstOffset": 0, "archivedOffset": 99, "completeUntil": "2026-05-28T20:26:19Z",
                                      "lagSeconds": 1, "gapMessages": 0, "gaps": []}
    phase, conds = ad.conditions(v, SPEC, None, NOW, 1)
    assert phase == "Archiving"
    assert {c["type"]: (c["status"], c["reason"]) for c in conds} == {
        "Ready": ("True", "Archiving"), "RPOMet": ("True", "WithinObjective"), "Degraded": ("False", "NoGap")}


def test_overdue_ticks_make_the_lag_grow_and_the_objective_missed():
    # last tick 80 s ago: due after 30 + 5 + 5 s, so 40 s overdue; lag 0.4 + 40
    v = ad.view(tick(T0 - 80_000, T0 - 80_400), T0, SPEC, {})
    assert v.overdue == pytest.approx(40.0) and v.status["lagSeconds"] == 41
    phase, conds = ad.conditions(v, SPEC, None, NOW, 1)
    by = {c["type"]: c for c in conds}
    assert phase == "Lagging"
    assert (by["Ready"]["status"], by["Ready"]["reason"]) == ("False", "TicksOverdue")
    assert by["RPOMet"]["status"] == "False"
    assert by["RPOMet"]["message"] == ("the archive is more than rpoSeconds=30 behind: recoverable until "
                                       "2026-05-28T20:25:19Z")


def test_a_busy_archive_behind_by_more_than_the_objective():
    v = ad.view(tick(T0 - 2_000, T0 - 50_000), T0, SPEC, {})  # ticks current, but catching up
    assert v.overdue == 0 and v.status["lagSeconds"] == 48
    assert ad.conditions(v, SPEC, None, NOW, 1)[0] == "Lagging"


def test_gaps_make_degraded_name_stream_and_range_and_stay_reported():
    gap = StreamGap(100, 149, T0 - 90_000, T0 - 30_000)
    streams = [TickStream("orders", "events.a", StreamInfo(first_offset=150, last_offset=180, gaps=[gap]), 1,
                          T0 - 1000, True)]
    v = ad.view(tick(T0 - 500, T0 - 1000, streams), T0, SPEC, {})
    assert v.status["gapMessages"] == 50
    text = "offsets 100..149 (50 messages) between 2026-05-28T20:25:10Z and 2026-05-28T20:26:10Z"
    assert v.status["streams"][0]["gaps"] == [text]
    by = {c["type"]: c for c in ad.conditions(v, SPEC, None, NOW, 1)[1]}
    assert by["Degraded"]["status"] == "True"
    assert by["Degraded"]["message"] == f"retention removed messages before the archive read them: orders/events.a {text}"
    # the next generation's tick no longer names the gap: the status keeps it
    later = [TickStream("orders", "events.a", StreamInfo(first_offset=181, last_offset=190), 1, T0, True)]
    v2 = ad.view(tick(T0, T0, later, gen="orders.20261206T090000.000Z", seq=0), T0, SPEC, v.status)
    assert v2.status["gapMessages"] == 50 and v2.gaps == [f"orders/events.a {text}"]


def test_no_tick_yet_is_pending_with_rpo_unknown():
    v = ad.view(None, T0, SPEC, {})
    phase, conds = ad.conditions(v, SPEC, None, NOW, 1)
    assert phase == "Pending"
    assert {c["type"]: c["reason"] for c in conds} == {"Ready": "NoTick", "RPOMet": "NoRecoveryPoint",
                                                       "Degraded": "NoGap"}


def _status(t: Tick, now_ms: int = T0, previous=None) -> dict:
    v = ad.view(t, now_ms, SPEC, previous or {})
    phase, conds = ad.conditions(v, SPEC, (previous or {}).get("conditions"), NOW, 1)
    return {**v.status, "phase": phase, "conditions": conds}


def test_status_writes_idle_every_3h_progress_every_30s_and_lag_changes_at_once():
    first = _status(tick(T0 - 1000, T0 - 1400))
    assert ad.status_patch({}, first, 0.0, 7.5) == first
    # idle: only recoverable-until moved (a new tick 30 s later): nothing to write until 3 hours passed
    idle = _status(tick(T0 + 29_000, T0 + 28_600, seq=4), T0 + 30_000, first)
    assert ad.status_patch(first, idle, 30.0, 7.5) == {}
    assert ad.status_patch(first, idle, 3 * 3600 - 1, 7.5) == {}
    assert set(ad.status_patch(first, idle, 3 * 3600, 7.5)) == {"recoverableUntil", "lastTickTime", "streams"}
    # the lag jumped by 10 s (>= the step): written at once
    behind = _status(tick(T0 + 29_000, T0 + 18_000, seq=4), T0 + 30_000, first)
    assert ad.status_patch(first, behind, 1.0, 7.5)["lagSeconds"] == 11
    # offsets moved, lag the same: at most every 30 s
    busy = [TickStream("orders", "events.a", StreamInfo(first_offset=0, last_offset=500), 1, T0 + 28_600, True),
            TickStream("orders", "events.b", StreamInfo(first_offset=0, last_offset=9), 1, T0 + 28_600, True)]
    moved = _status(tick(T0 + 29_000, T0 + 28_600, busy, seq=4), T0 + 30_000, first)
    assert ad.status_patch(first, moved, 10.0, 7.5) == {}
    assert ad.status_patch(first, moved, 30.0, 7.5)["streams"][0]["archivedOffset"] == 500
    # a condition that changed: at once
    late = _status(tick(T0 - 1000, T0 - 1400), T0 + 100_000, first)
    assert ad.status_patch(first, late, 1.0, 7.5)["phase"] == "Lagging"


# ---------------------------------------------------------------------------------------------
# one pass against a fake API


class FakeKube:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.deployments: dict[str, dict] = {}
        self.configmaps: dict[str, dict] = {}
        self.status: dict = {}
        self.pods: list[dict] = []

    def secret_values(self, ns, name):
        self.calls.append(("get", f"secret/{name}"))
        return {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}

    def get_deployment(self, ns, name):
        self.calls.append(("get", f"deployment/{name}"))
        return self.deployments.get(name)

    def create_deployment(self, body):
        self.calls.append(("create", "deployment"))
        self.deployments[body["metadata"]["name"]] = dict(body, metadata={**body["metadata"], "resourceVersion": "1"})
        return True

    def replace_deployment(self, body):
        self.calls.append(("update", "deployment"))
        self.deployments[body["metadata"]["name"]] = body
        return True

    def create_configmap(self, body):
        self.calls.append(("create", "configmap"))
        if body["metadata"]["name"] in self.configmaps:
            return False
        self.configmaps[body["metadata"]["name"]] = dict(body, metadata={**body["metadata"], "resourceVersion": "1"})
        return True

    def get_configmap(self, ns, name):
        self.calls.append(("get", f"configmap/{name}"))
        return self.configmaps.get(name)

    def replace_configmap(self, body):
        self.calls.append(("update", "configmap"))
        self.configmaps[body["metadata"]["name"]] = body
        return True

    def list_pods(self, ns, labels):
        self.calls.append(("list", "pods"))
        return [p for p in self.pods if labels.items() <= p["metadata"]["labels"].items()]

    def patch_status(self, plural, ns, name, patch):
        self.calls.append(("patch", f"{plural}/status"))
        self.status.update(patch)


@pytest.fixture
def pass_env(monkeypatch):
    storage = MemoryStorage()
    monkeypatch.setattr(ar, "open_backup_storage", lambda kube, ns, spec: storage)
    monkeypatch.setattr(ar.events, "post", lambda *a, **k: None)
    clock_ms = [T0]
    monkeypatch.setattr(ar, "wall_now", lambda: datetime.fromtimestamp(clock_ms[0] / 1000, timezone.utc))
    key = ("archive", "ns", "orders")
    yield storage, clock_ms, key
    ar.forget(key)


def test_a_pass_creates_the_archiver_then_follows_the_storage_without_api_reads(pass_env, caplog):
    storage, clock_ms, key = pass_env
    kube = FakeKube()
    ar.remember(key, owner())
    patch, due = ar.archive_pass(kube, "ns", "orders", caplog)
    assert ("create", "deployment") in kube.calls and kube.status["phase"] == "Pending"
    assert kube.deployments["rbak-archive-orders"]["spec"]["replicas"] == 1
    assert due == [NOW + ar.POLL]
    # the archiver writes a tick: the next pass reads it, and only writes the status
    t = tick(T0 + 500, T0 + 100, gen="orders.20261206T080000.000Z", seq=0)
    storage.put(tick_key("p/orders.20261206T080000.000Z", 0), t.to_json())
    clock_ms[0] = T0 + 1000
    kube.calls.clear()
    ar.archive_pass(kube, "ns", "orders", caplog)
    assert kube.calls == [("patch", "rabbitmqarchives/status")]
    assert kube.status["phase"] == "Archiving" and kube.status["recoverableUntil"] == "2026-05-28T20:26:40Z"
    # idle passes: nothing at all
    kube.calls.clear()
    for i in range(1, 4):
        storage.put(tick_key("p/orders.20261206T080000.000Z", i), tick(T0 + 500 + 30_000 * i, T0 + 100 + 30_000 * i,
                                                                        seq=i).to_json())
        clock_ms[0] = T0 + 1000 + 30_000 * i
        assert ar.archive_pass(kube, "ns", "orders", caplog)[0] == {}
    assert kube.calls == []
    # suspend: the Deployment goes to 0 replicas and the status says Suspended
    ar.remember(key, owner({**SPEC, "suspend": True}))
    ar.archive_pass(kube, "ns", "orders", caplog)
    assert kube.deployments["rbak-archive-orders"]["spec"]["replicas"] == 0
    assert ("update", "deployment") in kube.calls and kube.status["phase"] == "Suspended"


def test_a_bad_spec_is_failed_naming_the_field(pass_env, caplog):
    _, _, key = pass_env
    kube = FakeKube()
    ar.remember(key, owner({**SPEC, "storage": {"s3": {"bucket": "arch"}, "pvc": {"claimName": "x"}}}))
    ar.archive_pass(kube, "ns", "orders", caplog)
    ready = next(c for c in kube.status["conditions"] if c["type"] == "Ready")
    assert kube.status["phase"] == "Failed" and ready["reason"] == "InvalidSpec"
    assert ready["message"] == "Configuration error: spec.storage: set exactly one of s3 or pvc"
    assert not kube.deployments


REFUSAL = ("2026-12-06 22:07:37 INFO rbak.metrics: metrics on http://0.0.0.0:43389/metrics\n"
           "rbak: Configuration error: archive.taps.include: 'order' names no queue in vhost(s) 'shop'; nothing "
           "was archived\n")


def pod(name="rbak-archive-orders-ab12c", exit_code=2, finished="2026-05-28T20:26:50Z", message=REFUSAL,
        state=None, archive="orders") -> dict:
    last = {"terminated": {"exitCode": exit_code, "reason": "Error", "finishedAt": finished, "message": message}}
    return {"metadata": {"name": name, "creationTimestamp": "2026-05-28T20:26:00Z",
                         "labels": {**ad.labels(archive)}},
            "status": {"phase": "Running", "containerStatuses": [{
                "name": "archiver", "restartCount": 3, "lastState": last,
                "state": state or {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}}]}}


def test_archiver_exit_names_the_refusal_as_the_spec_names_the_field():
    said = ("the archiver (pod rbak-archive-orders-ab12c) exited with code 2: rbak: Configuration error: "
            "spec.taps.include: 'order' names no queue in vhost(s) 'shop'; nothing was archived")
    assert ad.archiver_exit([pod()], None) == said
    # an exit before the newest tick is history (the archiver ticked since): no cause of a missing tick
    running = pod(state={"running": {"startedAt": "2026-05-28T20:26:51Z"}})
    assert ad.archiver_exit([running], "2026-05-28T20:26:51.000Z") is None
    assert ad.archiver_exit([running], "2026-05-28T20:26:49.500Z") == said
    # exit 0 (a SIGTERM stop) is no failure; a pod that cannot start says so
    assert ad.archiver_exit([pod(exit_code=0, state={"running": {}})], None) is None
    pulling = pod(exit_code=0, state={"waiting": {"reason": "ImagePullBackOff", "message": "no such image rbak:x"}})
    assert ad.archiver_exit([pulling], None) == ("pod rbak-archive-orders-ab12c container archiver: "
                                                 "ImagePullBackOff: no such image rbak:x")
    # the newest exit of two pods wins; rbak archive's other fields named as the spec names them
    older = pod(name="rbak-archive-orders-00000", finished="2026-05-28T20:26:40Z")
    stream = pod(message="rbak: Configuration error: source.queues.include: 'x' matches no stream; archive it "
                         "through archive.taps (archive.taps.max_age)\n")
    assert ad.archiver_exit([older, stream], None) == (
        "the archiver (pod rbak-archive-orders-ab12c) exited with code 2: rbak: Configuration error: "
        "spec.queues.include: 'x' matches no stream; archive it through spec.taps (spec.taps.maxAge)")


def test_no_tick_and_an_exited_archiver_is_failed_with_its_message_once(pass_env, caplog, monkeypatch):
    storage, clock_ms, key = pass_env
    posted = []
    monkeypatch.setattr(ar.events, "post", lambda body, kind, reason, msg: posted.append((kind, reason, msg)))
    kube = FakeKube()
    ar.remember(key, owner({**SPEC, "taps": {"include": ["order"]}}))
    ar.archive_pass(kube, "ns", "orders", caplog)  # no pod yet: Pending, NoTick
    assert kube.status["phase"] == "Pending" and ("list", "pods") in kube.calls
    kube.pods = [pod(), pod(name="rbak-archive-other-ab12c", archive="other")]
    for _ in range(2):
        ar.archive_pass(kube, "ns", "orders", caplog)
    ready = next(c for c in kube.status["conditions"] if c["type"] == "Ready")
    assert kube.status["phase"] == "Failed" and (ready["status"], ready["reason"]) == ("False", "ArchiverFailing")
    assert ready["message"].endswith("spec.taps.include: 'order' names no queue in vhost(s) 'shop'; nothing was "
                                     "archived")
    assert posted == [("Normal", "ArchiverCreated", "created Deployment rbak-archive-orders (rbak archive)"),
                      ("Warning", "ArchiverFailing", ready["message"])]
    # the archiver ticks (fixed, or the exit was before a restart that worked): Archiving, no pod read
    storage.put(tick_key("p/orders.20261206T080000.000Z", 0), tick(T0 + 500, T0 + 100, seq=0).to_json())
    clock_ms[0] = T0 + 1000
    kube.calls.clear()
    ar.archive_pass(kube, "ns", "orders", caplog)
    assert kube.status["phase"] == "Archiving" and ("list", "pods") not in kube.calls


def test_restore_point_defaults_to_recoverable_and_refuses_past_it():
    ru = T0 + 1234
    assert ad.restore_point(None, ru, "orders") == ru
    assert ad.restore_point("recoverable", ru, "orders") == ru
    assert ad.restore_point(str(T0), ru, "orders") == T0
    assert ad.restore_point("2026-05-28T20:26:40.000Z", ru, "orders") == T0
    with pytest.raises(ConfigError, match=r"spec.archiveRef.pointInTime: 2026-05-28T20:26:42Z is after the archive's "
                                          r"recoverable-until 2026-05-28T20:26:41.234Z"):
        ad.restore_point("2026-05-28T20:26:42Z", ru, "orders")
    with pytest.raises(ConfigError, match=r"spec.archiveRef.name: the archive 'orders' holds no recoverable-until"):
        ad.restore_point(None, None, "orders")
    with pytest.raises(ConfigError, match=r"spec.archiveRef.pointInTime: 'yesterday' is not RFC 3339"):
        ad.restore_point("yesterday", ru, "orders")


def test_restore_point_before_the_archive_began_is_refused_naming_its_range():
    ru, began = T0 + 1234, T0 - 60_000
    span = ("; archive 'orders' can be restored to a point from 2026-05-28T20:25:40.000Z (its first generation "
            "began) to 2026-05-28T20:26:41.234Z (its recoverable-until)")
    assert ad.restore_point(str(began), ru, "orders", began) == began
    assert ad.restore_point("recoverable", ru, "orders", began) == ru
    with pytest.raises(ConfigError) as e:
        ad.restore_point("2026-05-28T20:25:39.999Z", ru, "orders", began)
    assert str(e.value) == ("Configuration error: spec.archiveRef.pointInTime: 2026-05-28T20:25:39.999Z is before "
                            "archive 'orders' began: no record is stamped that early, nothing would be restored" + span)
    with pytest.raises(ConfigError) as e:
        ad.restore_point(str(ru + 1), ru, "orders", began)
    assert str(e.value) == (f"Configuration error: spec.archiveRef.pointInTime: {ru + 1} is after the archive's "
                            "recoverable-until 2026-05-28T20:26:41.234Z: not every stream is archived up to it" + span)


def test_each_stream_shows_the_committed_offset_beside_the_archived_one():
    """The tick's committed end (as the archiver probed it) is in the status; a moved committed offset is
    progress (written at most every 30 s), an idle archive's newer probe instant alone is not."""
    from rbak.format.manifest_archive import CommittedEnd

    def streams(committed: int, at: int) -> list[TickStream]:
        return [TickStream("orders", "events.a", StreamInfo(first_offset=0, last_offset=99), 1, T0 - 1400, True,
                           committed=CommittedEnd(committed, at))]

    first = _status(tick(T0 - 1000, T0 - 1400, streams(120, T0 - 1500)))
    assert first["streams"][0]["archivedOffset"] == 99 and first["streams"][0]["committedOffset"] == 120
    assert first["streams"][0]["committedAt"] == "2026-05-28T20:26:38Z"
    idle = _status(tick(T0 + 29_000, T0 + 28_600, streams(120, T0 + 28_500), seq=4), T0 + 30_000, first)
    assert ad.status_patch(first, idle, 30.0, 7.5) == {}
    moved = _status(tick(T0 + 29_000, T0 + 28_600, streams(300, T0 + 28_500), seq=4), T0 + 30_000, first)
    assert ad.status_patch(first, moved, 10.0, 7.5) == {}
    assert ad.status_patch(first, moved, 30.0, 7.5)["streams"][0]["committedOffset"] == 300
