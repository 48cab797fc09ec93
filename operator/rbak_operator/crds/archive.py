"""The schema of ``RabbitMQArchive``: a continuous archiver (``rbak archive``) the operator keeps running.

The broker, the stream selection, the storage and the encryption are a RabbitMQBackup's fragments
(``crds.parts``), so one spec reads like the other. The status is written from what the archive in
the storage says (its newest tick), never from the pod's word alone.
"""

from __future__ import annotations

import copy
from typing import Any

from rbak_operator.crds.parts import (
    TIME_RE,
    boolean,
    broker_schema,
    condition_schema,
    encryption_schema,
    integer,
    k8s_name,
    obj,
    restore_drill_status_schema,
    storage_schema,
    string,
    strlist,
    verify_schema,
)

# RFC 3339 or epoch ms (as spec.pitr takes them), or "recoverable": the archive's recoverable-until
POINT_IN_TIME_RE = "^(recoverable|" + TIME_RE[1:-1] + ")$"
DEFAULT_RPO_SECONDS = 30
DEFAULT_MAX_DELAY_SECONDS = 5

# (name, type, JSONPath, priority): `kubectl get rmqarchive`
ARCHIVE_COLUMNS: list[tuple[str, str, str, int]] = [
    ("Phase", "string", ".status.phase", 0),
    ("RPO", "integer", ".spec.rpoSeconds", 0),
    ("Lag", "integer", ".status.lagSeconds", 0),
    ("Recoverable Until", "string", ".status.recoverableUntil", 0),
    ("Streams", "integer", ".status.streamCount", 0),
    ("Gaps", "integer", ".status.gapMessages", 0),
    ("Age", "date", ".metadata.creationTimestamp", 0),
    ("Drill RPO", "number", ".status.restoreDrill.recoveryPointSeconds", 1),  # -o wide: the last drill's
    ("Last Drill", "string", ".status.restoreDrill.result", 1),
]


def archive_spec_schema() -> dict[str, Any]:
    return obj(
        "Which streams to archive continuously, from which broker, into which storage, and the recovery point "
        "objective the status is judged against.",
        {
            "broker": broker_schema("The RabbitMQ whose streams are archived."),
            "queues": obj(
                "which streams (default: every stream the credentials can see); classic and quorum queues are "
                "never archived (a RabbitMQBackup backs them up)",
                {
                    "include": strlist("stream name globs to include"),
                    "exclude": strlist("stream name globs to exclude"),
                    "vhosts": strlist("vhosts (default: all); one archiver per vhost runs at a time (a lease)"),
                },
            ),
            "taps": obj(
                "classic and quorum queues archived through a stream rbak.tap.<queue> the archiver declares and binds "
                "as the queue is bound: it records what exchanges route to the queue, not what remained in it, and "
                "not what is published straight to it through the default exchange (docs/archive.md, Queue taps)",
                {
                    "include": {**strlist("queue name globs or names to tap (vhost/queue when a pattern has a /)",
                                          minLength=1), "minItems": 1, "x-kubernetes-list-type": "set"},
                    "exclude": {**strlist("queue name globs not to tap", minLength=1), "x-kubernetes-list-type": "set"},
                    "vhosts": strlist("vhosts to look in (default: spec.queues.vhosts)"),
                    "maxAge": string("each tap stream's retention (x-max-age), e.g. 7D", pattern="^[1-9][0-9]*[YMDhms]$",
                                     default="7D"),
                    "maxLengthBytes": integer("each tap stream's size cap (x-max-length-bytes)", minimum=1_000_000,
                                              default=10 * 1024 ** 3),
                },
                ["include"],
            ),
            "storage": storage_schema(),
            "rpoSeconds": integer("recovery point objective: RPOMet turns false when the archive's lag exceeds it",
                             minimum=1, maximum=86400, default=DEFAULT_RPO_SECONDS),
            "maxDelaySeconds": integer("a record is stored and named by a tick at most this long after it was read "
                                  "(rbak archive's archive.max_delay_secs)", minimum=1, maximum=3600,
                                  default=DEFAULT_MAX_DELAY_SECONDS),
            "compression": string("segment compression", enum=["zstd", "lz4", "none"], default="zstd"),
            "encryption": encryption_schema(backup=True),
            "suspend": boolean("scale the archiver to 0 (the archive stays; its lag grows and RPOMet turns false)",
                          default=False),
            "deletionPolicy": string(
                "on deleting this object: retain (default) keeps the archive's generations; delete removes them",
                enum=["retain", "delete"], default="retain"),
            "image": string("container image running rbak (default: the operator's RBAK_IMAGE)", minLength=1),
            "imagePullPolicy": string("image pull policy", enum=["Always", "IfNotPresent", "Never"]),
            "serviceAccountName": k8s_name("service account of the archiver's pod"),
            "resources": {
                "type": "object",
                "description": "the archiver container's resources (requests/limits)",
                "properties": {
                    "requests": {"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": True}},
                    "limits": {"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": True}},
                },
            },
            "verify": archive_verify_schema(),
        },
        ["broker", "storage"],
        **{"x-kubernetes-validations": [{
            "rule": "!has(self.maxDelaySeconds) || !has(self.rpoSeconds) || self.maxDelaySeconds <= self.rpoSeconds",
            "message": "spec.maxDelaySeconds must not exceed spec.rpoSeconds: the objective could never be met",
        }]},
    )


def stream_status_schema() -> dict[str, Any]:
    return obj(
        "one archived stream, from the newest tick in the storage",
        {
            "vhost": string("vhost"),
            "name": string("stream name"),
            "epoch": integer("1 + times the stream was deleted and declared again"),
            "present": boolean("the stream is on the broker (false: gone, its archive kept)"),
            "firstOffset": integer("first offset archived in the newest generation"),
            "archivedOffset": integer("last offset archived (its segment durable and named by a tick)"),
            "committedOffset": integer("the broker's last committed offset when the archiver last probed it "
                                       "(committedAt): archivedOffset reaches it when the archive is caught up"),
            "committedAt": string("when the archiver probed committedOffset", format="date-time"),
            "completeUntil": string("every record the broker stamped up to this instant is archived", format="date-time"),
            "lagSeconds": integer("how far the stream's complete-until is behind now"),
            "gapMessages": integer("messages the stream's retention removed before the archive read them"),
            "gaps": strlist("recorded gaps: 'offsets A..B (N messages) between T1 and T2'"),
        },
    )


def archive_status_schema() -> dict[str, Any]:
    return obj(
        "Observed state, read from the archive's newest tick in the storage.",
        {
            "phase": string("Pending (no tick yet), Archiving, Lagging (over the objective), Suspended, Failed",
                        enum=["Pending", "Archiving", "Lagging", "Suspended", "Failed"]),
            "observedGeneration": integer("spec generation last acted on"),
            "conditions": condition_schema(),
            "archiveName": string("the archive's name in the storage: its generations are <name>.<UTC time>"),
            "deployment": string("the Deployment running rbak archive"),
            "configMap": string("the ConfigMap holding its config"),
            "generation": string("the newest generation (a backup id)"),
            "lastTickTime": string("when the newest tick was written", format="date-time"),
            "recoverableUntil": string("every stream is archived up to this instant: a restore to it is consistent "
                                   "across streams", format="date-time"),
            "lagSeconds": integer("now minus recoverableUntil, as of the newest tick plus how overdue the next one is"),
            "streamCount": integer("streams in the archive"),
            "gapMessages": integer("messages lost to retention before the archive read them (every recorded gap)"),
            "streams": {"type": "array", "description": "per stream", "maxItems": 200,
                        "items": stream_status_schema()},
            "restoreDrill": archive_drill_status_schema(),
        },
    )


def archive_ref_schema() -> dict[str, Any]:
    """A RabbitMQRestore's ``spec.archiveRef``: restore every stream of an archive up to one instant."""
    return obj(
        "a RabbitMQArchive in this namespace: every stream of its archive restored up to pointInTime (its storage, "
        "and its broker as the default target); the streams must exist on the target (declare them first)",
        {
            "name": k8s_name("RabbitMQArchive name"),
            "pointInTime": {"x-kubernetes-int-or-string": True, "pattern": POINT_IN_TIME_RE,
                            "description": "restore every stream up to this instant (RFC 3339 or epoch ms); "
                                           "'recoverable' (default): the archive's recoverable-until"},
        },
        ["name"],
    )


def archive_verify_schema() -> dict[str, Any]:
    """``spec.verify.restoreDrill`` as a RabbitMQBackup has it, plus ``lookbackSeconds``: what is drilled is the
    archive's state of a few minutes ago, compared with the live streams (``rbak drill --archive``)."""
    verify = copy.deepcopy(verify_schema())
    drill = verify["properties"]["restoreDrill"]
    drill["description"] = (
        "Restore drills of the archive: on their own schedule, restore every stream as the archive held it "
        "lookbackSeconds ago (never past its recoverable-until) into a scratch vhost on the target, compare it "
        "record by record with the live source streams over the same offsets, delete the scratch vhost, and record "
        "the recovery point achieved and the restore time (RTO) in status.restoreDrill and the signed report.")
    drill["properties"]["lookbackSeconds"] = integer(
        "how far back the drilled state is; the live streams must still hold it (their retention)", minimum=0,
        maximum=604800, default=300)
    return verify


def archive_drill_status_schema() -> dict[str, Any]:
    """``status.restoreDrill`` of a backup, plus what an archive drill measures."""
    st = copy.deepcopy(restore_drill_status_schema())
    props = st["properties"]
    props["backupId"] = string("the generation drilled (the archive's newest when the drill started)")
    props.update({
        "recoveryPointSeconds": {"type": "number", "description": "recovery point achieved: how far the archive's "
                                 "recoverable-until was behind the drill's start (compare with spec.rpoSeconds)"},
        "restoreSeconds": {"type": "number", "description": "RTO: wall time of the restore into the scratch vhost"},
        "restorePoint": string("every stream was restored up to this instant", format="date-time"),
        "recoverableUntil": string("the archive's recoverable-until when the drill started", format="date-time"),
        "streams": integer("streams compared"),
        "failedStreams": strlist("streams that did not match the live ones, 'vhost/name'"),
        "evidenceKey": string("storage key of the drill's report (signed with signingKeySecretRef)"),
    })
    return st
