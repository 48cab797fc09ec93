"""Restore drills: prove a backup restores, without touching anything but a scratch vhost.

A drill takes the newest complete backup (or a given one), creates ONE fresh
vhost on the target (``rbak-drill-<backup>-<random>``, never an existing one,
never a source vhost), declares every backed-up queue in it with its type
(``x-queue-type`` only: TTLs, length limits and priorities belong to policies
and would make the count differ from what the backup holds), publishes each
queue's records through the restore engine (``restore_queue_segments``, the
same confirmed path ``rbak restore`` uses), then reads every message back and
compares, per queue, with the backup:

- expected: the manifest's ``message_count`` and a SHA-256 over the records
  decoded from the queue's segments (each segment checked against the
  manifest's size and SHA-256 on the way);
- actual: the messages the broker hands back from the scratch queue, counted
  and hashed the same way (body, content type, message id, correlation id,
  in order).

The scratch vhost is deleted in a ``finally`` (a failure half-way, or SIGTERM
turned into an exception by the CLI, still removes it). The report is stored
next to the backup under a new key per drill (``drills/<ts>-<id>.json``), so
the write-once (Object Lock) mode holds. With ``drill.signing_key_file`` the report is
signed (Ed25519, ``rbak.repo.evidence``) before it is stored: evidence an auditor can check
with ``rbak drill verify`` and the public key.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from ..broker.cluster import split_broker
from ..broker.connect import connect
from ..broker.deliveries import receive
from ..broker.management import ManagementClient
from ..broker.management import q as path_segment
from ..broker.stream_end import NO_STREAM_LISTENER, foreign_stream_cluster
from ..config import SCRATCH_VHOST_PREFIX, ConnectionConfig
from ..errors import (
    AmqpError,
    ConfigError,
    DrillError,
    ManagementApiError,
    NotFoundError,
    RbakError,
)
from ..format.archive import TICK_DIR
from ..format.layout import DRILLS_DIR, BackupLayout, check_backup_id
from ..format.manifest import BackupManifest, QueueBackup
from ..format.reader import read_segment
from ..repo.catalog import latest_complete, newest_report
from ..repo.evidence import load_signing_key, scratch_words, sign, signing_key_from_env
from ..repo.validate import utc_stamp
from ..restore.engine import load_complete_manifest
from ..restore.options import RestoreOptions
from ..restore.plan import plan_queue, plan_restore
from ..restore.queue_restore import plan_codec, restore_queue_segments
from ..restore.source import BackupSource
from ..storage.base import Storage

log = logging.getLogger(__name__)



# --------------------------------------------------------------------------
# On-wire structures.
# --------------------------------------------------------------------------


@dataclass
class QueueCheck:
    """One backed-up queue: what the backup says and what the scratch vhost gave back."""

    vhost: str
    queue: str
    queue_type: str
    scratch_queue: str
    expected_count: int
    actual_count: int | None = None
    records_count: int | None = None  # records decoded from the segments (should equal expected_count)
    expected_hash: str | None = None
    actual_hash: str | None = None
    passed: bool = False
    error: str | None = None

    @property
    def hash_match(self) -> bool:
        return self.expected_hash is not None and self.expected_hash == self.actual_hash

    def to_json_obj(self) -> dict[str, Any]:
        return {**asdict(self), "hash_match": self.hash_match}


@dataclass
class DrillReport:
    drill_id: str
    backup_id: str | None
    target: str  # the target's management URL (no credentials)
    scratch_vhost: str | None = None
    started_at: str = ""
    duration_secs: float = 0.0
    passed: bool = False
    reason: str = ""
    scratch_vhost_removed: bool = True
    queues: list[QueueCheck] = field(default_factory=list)
    report_key: str | None = None
    manifest_sha256: str | None = None  # of manifest.json as stored: which backup exactly was drilled
    broker_version: str | None = None  # the drill target's RabbitMQ version
    finished_at: str = ""
    signature: dict[str, Any] | None = None  # rbak.repo.evidence.sign over the rest (only when a key is configured)
    # a drill of a continuous archive (rbak.drill.archive): a JSON object of ``ArchiveDrill`` (None: a backup's)
    archive: dict[str, Any] | None = None

    @property
    def failed_queues(self) -> list[QueueCheck]:
        return [q for q in self.queues if not q.passed]

    def to_json_obj(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("queues", "signature", "archive")}
        d["duration_secs"] = round(self.duration_secs, 3)
        d["result"] = "Passed" if self.passed else "Failed"
        d["queues"] = [q.to_json_obj() for q in self.queues]
        if self.archive is not None:  # only an archive drill's: a backup drill's report is as it was
            d["archive"] = self.archive
        if self.signature is not None:
            d["signature"] = self.signature
        return d

    def sign(self, key: Any) -> None:
        """Sign the report as it is now (call again after any change: the signature covers every field)."""
        self.signature = None
        self.signature = sign(self.to_json_obj(), key)

    def lines(self) -> list[str]:
        out = []
        for q in self.queues:
            state = "ok" if q.passed else f"FAILED: {q.error}"
            out.append(f"{q.vhost}/{q.queue} ({q.queue_type}): expected {q.expected_count}, restored and read back "
                       f"{q.actual_count if q.actual_count is not None else '-'}, hash "
                       f"{'match' if q.hash_match else 'MISMATCH' if q.actual_hash else '-'}; {state}")
        verdict = "PASSED" if self.passed else f"FAILED: {self.reason}"
        out.append(f"drill {self.drill_id} of backup {self.backup_id}: {len(self.queues)} queue(s) in "
                   f"{scratch_words(self.scratch_vhost, self.scratch_vhost_removed)}, "
                   f"{self.duration_secs:.1f} s: {verdict}")
        if self.signature is not None:
            out.append(f"report {self.report_key or '(not stored)'} signed by key {self.signature['key_fingerprint']}")
        return out


@dataclass(frozen=True)
class DrillOptions:
    target: ConnectionConfig
    prefix: str = ""
    backup_id: str | None = None  # None: the newest complete backup
    drill_id: str = ""  # "" : a random one
    scratch_prefix: str = SCRATCH_VHOST_PREFIX
    read_timeout_secs: float = 10.0
    produce_batch_size: int = 500
    store_report: bool = True
    keys: tuple[tuple[str, bytes], ...] = field(default=(), repr=False)
    signing_key: Any = field(default=None, repr=False)  # Ed25519PrivateKey: sign the report
    kms_region: str | None = None  # envelope backups wrapped by KMS (encryption.kms_*)
    kms_endpoint_url: str | None = None
    section: str = "drill.target"  # the config section ``target`` came from (named by errors)


def options_from_config(cfg: Any, backup_id: str | None = None, drill_id: str | None = None) -> DrillOptions:
    """From a validated ``rbak.config.Config`` of any mode: target ``drill.target``, else ``source``, else ``target``."""
    conn = cfg.drill.target or cfg.source or cfg.target
    if conn is None:
        raise ConfigError("drill.target: required (the config has no source or target either)")
    keys = tuple(sorted(cfg.encryption.keyring().items()))
    signing_key = None
    if cfg.drill.signing_key_file:
        signing_key = load_signing_key(cfg.drill.signing_key_file)  # before the drill: a bad key fails fast
    elif cfg.drill.signing_key_env:
        signing_key = signing_key_from_env(cfg.drill.signing_key_env)
    section = "drill.target" if cfg.drill.target else "source" if cfg.source else "target"
    return DrillOptions(target=conn, section=section, prefix=cfg.storage.prefix or "",
                        backup_id=backup_id or (cfg.backup_id if cfg.mode != "backup" else None),
                        drill_id=drill_id or "", scratch_prefix=cfg.drill.scratch_vhost_prefix,
                        read_timeout_secs=cfg.drill.read_timeout_secs,
                        produce_batch_size=cfg.restore.produce_batch_size, store_report=cfg.drill.store_report,
                        keys=keys, signing_key=signing_key, kms_region=cfg.encryption.kms_region,
                        kms_endpoint_url=cfg.encryption.kms_endpoint_url)


# --------------------------------------------------------------------------
# Pure decisions.
# --------------------------------------------------------------------------


def without_credentials(url: str) -> str:
    """A URL without its ``user:password@`` (the report is stored, and signed, next to the backup)."""
    parts = urlsplit(url or "")
    if "@" not in parts.netloc:
        return url
    return urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[1], parts.path, parts.query, parts.fragment))


def new_drill_id() -> str:
    return secrets.token_hex(4)


def scratch_vhost_name(backup_id: str, drill_id: str, prefix: str = SCRATCH_VHOST_PREFIX) -> str:
    return f"{prefix}-{backup_id}-{drill_id}"


def scratch_queue_names(queues: list[QueueBackup]) -> dict[tuple[str, str], str]:
    """Queue names in the one scratch vhost: the backed-up name, or ``<vhost>/<name>`` where two
    source vhosts hold a queue of the same name (so they cannot collide)."""
    seen: dict[str, int] = {}
    for q in queues:
        seen[q.name] = seen.get(q.name, 0) + 1
    return {(q.vhost, q.name): q.name if seen[q.name] == 1 else f"{q.vhost}/{q.name}" for q in queues}


class RecordHash:
    """SHA-256 over messages in order: each field length-prefixed, so no two sequences collide."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self.count = 0

    def add(self, body: bytes, content_type: str | None, message_id: str | None, correlation_id: str | None) -> None:
        for part in (bytes(body), *((s or "").encode("utf-8") for s in (content_type, message_id, correlation_id))):
            self._h.update(struct.pack(">I", len(part)))
            self._h.update(part)
        self.count += 1

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def judge(check: QueueCheck) -> QueueCheck:
    """Set ``passed``/``error`` from the counts and hashes (an earlier error stands)."""
    where = f"queue {check.queue!r} in vhost {check.vhost!r}"
    if check.error is None:
        if check.records_count is not None and check.records_count != check.expected_count:
            check.error = (f"{where}: the manifest says {check.expected_count} message(s), its segments hold "
                           f"{check.records_count}")
        elif check.actual_count != check.expected_count:
            check.error = (f"{where}: expected {check.expected_count} message(s), the scratch queue gave back "
                           f"{check.actual_count}")
        elif not check.hash_match:
            check.error = f"{where}: record hash of the restored messages differs from the backup's"
    check.passed = check.error is None
    return check


# --------------------------------------------------------------------------
# The drill.
# --------------------------------------------------------------------------


def choose_backup(storage: Storage, options: DrillOptions) -> str:
    if options.backup_id:
        return check_backup_id(options.backup_id)
    entry = latest_complete(storage, options.prefix, with_data=True)
    if entry is None:
        raise NotFoundError(f"{storage.url}: no complete backup holding data to drill")
    return entry.backup_id


def expected_hash(storage: Storage, q: QueueBackup, codec: Any) -> RecordHash:
    """Hash of a queue's records as the backup holds them (size and SHA-256 of every segment checked);
    ``codec``: the queue's plan's (``plan_codec``: an incremental stream's links each with its own key)."""
    h = RecordHash()
    for seg in q.segments:
        for _, r in read_segment(storage, seg, True, codec=codec):
            p = r.properties
            h.add(r.body, p.content_type, p.message_id, p.correlation_id)
    return h


def read_back(conn: Any, queue: str, expected: int, idle_secs: float, stream: bool = False) -> RecordHash:
    """Consume every message of a scratch queue (it is thrown away afterwards), in order.

    Stops ``idle_secs`` after the last delivery, or half a second after the
    expected count arrived (so extra messages are still seen)."""
    h = RecordHash()
    ch = conn.channel()
    ch.qos(500)
    last = time.monotonic()
    tag = ch.consume(queue, {"x-stream-offset": "first"} if stream else None)
    for method, props, body in receive(conn, ch, tag, 0.1):
        now = time.monotonic()
        if method is not None:
            h.add(body, props.content_type, props.message_id, props.correlation_id)
            ch.ack(method.delivery_tag)
            last = now
        idle = now - last
        if idle > idle_secs or (h.count >= expected and idle > 0.5):
            break
    ch.close()
    return h


def _amqp_user(target: ConnectionConfig) -> str:
    return target.username


def _create_scratch(client: Any, name: str, avoid: set[str], options: DrillOptions,
                    attempted: Callable[[], None]) -> None:
    """Create the scratch vhost (never an existing or a source vhost) and let the run's users in.

    ``attempted`` is called just before the PUT: from then on the vhost may exist (a signal may cut the
    request after the broker made it), so the caller deletes it whatever happens next."""
    if name in avoid or client.exists(f"vhosts/{path_segment(name)}") is not None:
        raise DrillError(f"scratch vhost {name!r} already exists; refusing to use it")
    attempted()
    client.request("PUT", f"vhosts/{path_segment(name)}", {"description": "rbak restore drill (deleted when the drill ends)"})
    perm = {"configure": ".*", "write": ".*", "read": ".*"}
    for user in {client.username, _amqp_user(options.target)}:
        client.request("PUT", f"permissions/{path_segment(name)}/{path_segment(user)}", perm)


def run_drill(storage: Storage, options: DrillOptions,
              on_scratch_created: Callable[[str], None] | None = None) -> DrillReport:
    """Restore a backup into a scratch vhost, compare it, delete the vhost; never raises for a failed
    check (the report says why), raises only for what stops the drill before a vhost exists."""
    t0 = time.monotonic()
    drill_id = options.drill_id or new_drill_id()
    backup_id = choose_backup(storage, options)
    report = DrillReport(drill_id, backup_id, without_credentials(options.target.management_url),
                         started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def work(make_scratch: Callable[[set[str]], str]) -> list[str]:
        ropts = RestoreOptions(backup_id=backup_id, prefix=options.prefix, target=options.target,
                               produce_batch_size=options.produce_batch_size, keys=options.keys,
                               kms_region=options.kms_region, kms_endpoint_url=options.kms_endpoint_url)
        manifest = load_complete_manifest(BackupSource(storage, options.prefix), ropts)
        report.manifest_sha256 = hashlib.sha256(storage.get(BackupLayout(backup_id, options.prefix).manifest)
                                                ).hexdigest()
        report.scratch_vhost = scratch_vhost_name(backup_id, drill_id, options.scratch_prefix)
        scratch = make_scratch({qb.vhost for qb in manifest.queues})
        _drill_queues(storage, manifest, ropts, options, report, scratch)
        return [q.error or "failed" for q in report.failed_queues]  # judge() fails a queue only with an error

    return in_scratch_vhost(storage, options, report, t0, f"backup {backup_id!r}", "queue", work,
                            on_scratch_created)


def in_scratch_vhost(storage: Storage, options: DrillOptions, report: DrillReport, t0: float, what: str, noun: str,
                     work: Callable[[Callable[[set[str]], str]], list[str]],
                     on_scratch_created: Callable[[str], None] | None = None,
                     on_finish: Callable[[], None] | None = None) -> DrillReport:
    """The frame of every drill (a backup's, an archive's): the target checked (its version; one cluster
    behind both URLs), ``work(make_scratch)`` run, the scratch vhost deleted whatever happens, the report
    finished, stored and signed. ``work`` calls ``make_scratch(source vhosts)`` to create the vhost named
    ``report.scratch_vhost`` and returns the errors of the checks that failed; ``what`` starts the reason."""
    client = ManagementClient.for_connection(options.target, options.section)  # errors name the config's key
    created: list[bool] = []  # non-empty once the vhost PUT was sent

    def make_scratch(avoid: set[str]) -> str:
        assert report.scratch_vhost is not None  # work names it first
        _create_scratch(client, report.scratch_vhost, avoid, options, lambda: created.append(True))
        if on_scratch_created is not None:
            on_scratch_created(report.scratch_vhost)
        return report.scratch_vhost

    try:
        overview = _overview_as_admin(client, options.section)
        report.broker_version = str(overview.get("rabbitmq_version") or "") or None
        try:
            problem = split_broker(options.section, options.target, overview.get("cluster_name"))
        except AmqpError:  # an AMQP side that cannot be reached fails the restore step, which names it
            problem = None
        if problem:  # the scratch vhost would be made on one broker and restored into on another
            raise DrillError(f"{problem}; no scratch vhost was created")
        _warn_stream_port(options, overview.get("cluster_name"))
        errors = work(make_scratch)
        report.passed = not errors
        if errors:
            report.reason = f"{what}: {errors[0]}" + (
                f" (and {len(errors) - 1} more {noun}(s))" if len(errors) > 1 else "")
    except RbakError as e:
        report.passed, report.reason = False, f"{what}: {e.args[0] if e.args else e}"
    except Exception as e:  # a drill reports every failure, and still cleans up
        log.exception("restore drill %s of %s", report.drill_id, what)
        report.passed, report.reason = False, f"{what}: {type(e).__name__}: {e}"
    finally:
        if created:
            _remove_scratch(client, report)  # a 404 (the PUT never landed) counts as removed
        else:  # stopped before the PUT: no vhost was made, so none is reported made (or removed)
            report.scratch_vhost = None
        client.close()
        if on_finish is not None:
            on_finish()
        report.duration_secs = time.monotonic() - t0
        report.finished_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if options.store_report:
        store_drill_report(storage, report, options.prefix, options.signing_key)
    elif options.signing_key is not None:
        report.sign(options.signing_key)
    return report


def _warn_stream_port(options: DrillOptions, cluster: str | None) -> None:
    """A stream port of another cluster (the default 5552 on a host running several brokers) makes every
    scratch stream's end a quiet period: the drill still judges right, but its RTO is inflated. Said."""
    t = options.target
    try:
        stream = foreign_stream_cluster(t, cluster)
    except NO_STREAM_LISTENER:
        return  # nobody listens there: the restore says so itself
    if stream is not None:
        log.warning("%s.stream_port: %s:%d answers for cluster %r, but %s is cluster %r: each scratch stream's end "
                    "is found by a quiet period and the RTO reported is inflated; set %s.stream_port to this broker's "
                    "stream port", options.section, t.host, t.stream_port, stream, without_credentials(t.management_url),
                    cluster, options.section)


def _overview_as_admin(client: ManagementClient, section: str) -> dict[str, Any]:
    """The target's overview, once its user is known to hold the administrator tag the scratch vhost needs:
    without it the broker answers 401 to the vhost's GET as to a wrong password, which would mislead."""
    try:
        overview = client.overview()
        me = client.request("GET", "whoami") or {}
    except ManagementApiError as e:
        if e.status == 401:
            raise DrillError(f"{e.args[0]}; a drill's user also needs the administrator tag (it creates and deletes "
                             "the scratch vhost); no scratch vhost was created") from None
        raise
    tags = me.get("tags") or []
    tags = tags.split(",") if isinstance(tags, str) else list(tags)  # a string before RabbitMQ 3.9
    if "administrator" not in tags:
        raise DrillError(f"{section}: user {client.username!r} has the tags {', '.join(tags) or '(none)'}; a drill "
                         "needs the administrator tag (it creates and deletes the scratch vhost); no scratch vhost "
                         "was created")
    return overview


def _remove_scratch(client: Any, report: DrillReport, attempts: int = 3) -> None:
    """Delete the scratch vhost (its queues go with it); retried, and any failure recorded as the drill's."""
    err: RbakError | None = None
    assert report.scratch_vhost is not None  # named before the vhost PUT was sent
    path = f"vhosts/{path_segment(report.scratch_vhost)}"
    for _ in range(attempts):
        try:
            client.delete(path)
            if client.exists(path) is None:  # an interrupted PUT may still land after the DELETE
                return
            err = DrillError("it still exists after DELETE")
            time.sleep(0.2)
        except RbakError as e:  # a management error, or a signal turned into one mid-request: try again
            err = e
    report.scratch_vhost_removed = False
    report.passed = False
    report.reason = (report.reason + "; " if report.reason else "") + (
        f"could not delete scratch vhost {report.scratch_vhost!r}: {err.args[0] if err and err.args else err}")
    log.error("%s", report.reason)


def _drill_queues(storage: Storage, manifest: BackupManifest, ropts: RestoreOptions, options: DrillOptions,
                  report: DrillReport, scratch: str) -> None:
    """Restore every queue into ``scratch`` (``report.scratch_vhost``), read it back and judge it."""
    source = BackupSource(storage, options.prefix)
    names = scratch_queue_names(manifest.queues)
    vmap = tuple(sorted({(qb.vhost, scratch) for qb in manifest.queues}))
    qmap = tuple(sorted((f"{v}/{n}", s) for (v, n), s in names.items()))  # all: a queue tap stays a stream
    ropts = replace(ropts, vhost_mapping=vmap, queue_mapping=qmap).with_data_key(source, manifest)
    plans = {(p.source_vhost, p.source_queue): p for p in plan_restore(manifest, ropts)}
    conn = connect(options.target, scratch, "target")
    try:
        for qb in manifest.queues:
            check = QueueCheck(qb.vhost, qb.name, qb.queue_type, names[(qb.vhost, qb.name)], qb.message_count)
            report.queues.append(check)
            try:
                plan = plans.get((qb.vhost, qb.name)) or plan_queue(qb, ropts, manifest.encryption)
                h = expected_hash(storage, qb, plan_codec(plan, ropts))
                check.records_count, check.expected_hash = h.count, h.hexdigest()
                ch = conn.channel()
                ch.declare(check.scratch_queue, durable=True, arguments={"x-queue-type": qb.queue_type})
                ch.close()
                restore_queue_segments(source, plans[(qb.vhost, qb.name)], ropts, None, connection=conn)
                got = read_back(conn, check.scratch_queue, check.records_count, options.read_timeout_secs,
                                stream=qb.queue_type == "stream")
                check.actual_count, check.actual_hash = got.count, got.hexdigest()
            except RbakError as e:
                msg = e.args[0] if isinstance(e, RbakError) and e.args else f"{type(e).__name__} {e}"
                check.error = f"queue {qb.name!r} in vhost {qb.vhost!r}: {msg}"
            judge(check)
            if not conn.is_open:
                conn = connect(options.target, scratch, "target")
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass


# --------------------------------------------------------------------------
# Reports in storage.
# --------------------------------------------------------------------------


def store_drill_report(storage: Storage, report: DrillReport, prefix: str = "", signing_key: Any = None
                       ) -> str | None:
    """Write the report (signed when a key is given) as a new object next to the backup; a storage
    failure is logged, not fatal."""
    def unstored() -> None:
        report.report_key = None
        if signing_key is not None:
            report.sign(signing_key)  # what is printed is signed as it is

    layout = BackupLayout(report.backup_id, prefix) if report.backup_id else None
    if layout is None:
        unstored()
        return None
    key = layout.drill_report(utc_stamp(), report.drill_id)
    report.report_key = key
    if signing_key is not None:
        report.sign(signing_key)  # the key it is stored under is part of the evidence
    try:
        if not storage.exists(layout.manifest) and next(iter(storage.list(f"{layout.root}/{TICK_DIR}/")), None) is None:
            unstored()
            return None  # no such backup (nor an open archive generation): never start a folder for it
        storage.put(key, orjson.dumps(report.to_json_obj(), option=orjson.OPT_INDENT_2))
    except RbakError as e:
        log.warning("could not store the drill report %s: %s", key, e)
        unstored()
    return report.report_key


def find_drill_report(storage: Storage, backup_id: str, prefix: str = "", drill_id: str | None = None
                      ) -> tuple[str, dict[str, Any]] | None:
    """(key, report) of the newest drill report of a backup (of ``drill_id`` when given), or None; an
    unreadable one counts as a failed drill."""
    found = newest_report(storage, BackupLayout(backup_id, prefix).drills_dir,
                          lambda name: drill_id is None or name.endswith(f"-{drill_id}.json"))
    if found is None:
        return None
    key, report = found
    if isinstance(report, str):
        return key, {"passed": False, "result": "Failed", "reason": f"unreadable drill report: {report}"}
    return key, report


__all__ = ["DRILLS_DIR", "DrillError", "DrillOptions", "DrillReport", "QueueCheck", "RecordHash", "find_drill_report",
           "judge", "run_drill", "scratch_queue_names", "scratch_vhost_name", "store_drill_report"]
