"""The two CRDs as Python data: ``crds/*.yaml`` is generated from here.

One source keeps the shared fragments (broker, storage, pod overrides) equal
in both CRDs; ``python -m rbak_operator.crds.schema crds/`` rewrites the YAML files
and a test fails when they drift. Validation lives in the schema itself
(enums, patterns, minimums, required, CEL rules with readable messages) so
``kubectl apply`` refuses a bad object before the operator ever sees it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from rbak_operator.crds.parts import (
    CRON_MESSAGE,
    CRON_RE,
    DURATION_RE,
    TIME_RE,
    boolean,
    broker_schema,
    condition_schema,
    encryption_schema,
    integer,
    k8s_name,
    obj,
    pod_overrides,
    printer_columns,
    progress_schema,
    restore_drill_status_schema,
    run_summary_schema,
    spark_schema,
    storage_schema,
    string,
    strlist,
    verify_schema,
)
from rbak_operator.crds.archive import ARCHIVE_COLUMNS, archive_ref_schema, archive_spec_schema, archive_status_schema

GROUP = "rbak.io"
VERSION = "v1alpha1"
BACKUP_PLURAL = "rabbitmqbackups"
RESTORE_PLURAL = "rabbitmqrestores"
ARCHIVE_PLURAL = "rabbitmqarchives"
# The RabbitMQ cluster operator's RabbitmqCluster (read for status.defaultUser.secretReference).
RABBITMQ_GROUP = "rabbitmq.com"
SPARK_GROUP, SPARK_VERSION, SPARK_PLURAL = "sparkoperator.k8s.io", "v1beta2", "sparkapplications"  # kubeflow spark-operator
RABBITMQ_VERSION = "v1beta1"
RABBITMQ_CLUSTERS = "rabbitmqclusters"


def backup_crd() -> dict[str, Any]:
    return _crd(
        kind="RabbitMQBackup",
        plural=BACKUP_PLURAL,
        singular="rabbitmqbackup",
        short=["rbak"],
        spec=backup_spec_schema(),
        status=backup_status_schema(),
        columns=[
            ("Phase", "string", ".status.phase", 0),
            ("Schedule", "string", ".spec.schedule", 0),
            ("Suspend", "boolean", ".spec.suspend", 1),
            ("Last Backup", "string", ".status.lastBackupId", 0),
            ("Last Success", "date", ".status.lastSuccessfulTime", 1),
            # a future time: `date` columns show the age since the value (`<invalid>` ahead of now)
            ("Next Run", "string", ".status.nextScheduleTime", 0),
            ("Messages", "integer", ".status.lastRun.messages", 0),
            ("Held", "integer", ".status.lastRun.heldByConsumers", 0),
            ("Size", "string", ".status.lastRun.size", 0),
            ("Last Drill", "string", ".status.restoreDrill.result", 1),
            *printer_columns("backup"),
            ("Age", "date", ".metadata.creationTimestamp", 0),
        ],
    )


def backup_spec_schema() -> dict[str, Any]:
    return obj(
        "What to back up, where, and when.",
        {
            "broker": broker_schema("The RabbitMQ to back up."),
            "queues": obj(
                "Which queues (default: all)",
                {
                    "include": strlist("queue name globs to include"),
                    "exclude": strlist("queue name globs to exclude"),
                    "vhosts": strlist("vhosts (default: all)"),
                    "types": {
                        "type": "array",
                        "description": "queue types",
                        "items": {"type": "string", "enum": ["classic", "quorum", "stream"]},
                    },
                    "minMessages": integer("skip queues with fewer messages", minimum=0),
                },
            ),
            "storage": storage_schema(),
            "compression": string("segment compression", enum=["zstd", "lz4", "none"], default="zstd"),
            "compressionLevel": integer("zstd level", minimum=1, maximum=22, default=3),
            "segmentMaxBytes": integer("rotate a segment after this many uncompressed bytes", minimum=1024),
            "segmentMaxIntervalMs": integer("rotate a segment after this many ms", minimum=1000),
            "includeDefinitions": boolean("also store the broker definitions", default=True),
            **schedule_fields(),
            "retention": retention_schema(),
            "deletionPolicy": string(
                "on deleting this object: retain (default) keeps stored backups; delete removes the ones it made",
                enum=["retain", "delete"],
                default="retain",
            ),
            "validate": obj(
                "verify each backup after its run",
                {
                    "enabled": boolean("validate after each run", default=True),
                    "deep": boolean("decompress and check every record", default=False),
                    "sparkThresholdBytes": integer(
                        "above this stored size, validate with a SparkApplication instead of in the Job", minimum=0
                    ),
                },
            ),
            "verify": verify_schema(),
            "spark": spark_schema(),
            "encryption": encryption_schema(backup=True),
            "objectLock": object_lock_schema(),
            **pod_overrides(),
        },
        ["broker", "storage"],
    )


def backup_status_schema() -> dict[str, Any]:
    return obj(
        "Observed state, read from Jobs and manifest.json.",
        {
            "phase": string("Pending, Scheduled, Running, Succeeded, Failed, Suspended", enum=[
                "Pending", "Scheduled", "Running", "Succeeded", "Failed", "Suspended"]),
            "observedGeneration": integer("spec generation last acted on"),
            "conditions": condition_schema(),
            "lastScheduleTime": string("last slot acted on (written before its Job is created)", format="date-time"),
            "lastSuccessfulTime": string("end of the last successful run", format="date-time"),
            "nextScheduleTime": string("next slot", format="date-time"),
            "lastBackupId": string("backup id of the last successful run"),
            "lastScheduledRun": string("Job/backup id of the last slot started (re-created after a crash)"),
            "lastManualTrigger": string("value of the rbak.io/backup-now annotation last run"),
            "active": strlist("Jobs running now"),
            "lastRun": run_summary_schema("the most recent finished run"),
            "history": {
                "type": "array",
                "description": "recent finished runs, newest first",
                "maxItems": 20,
                "items": run_summary_schema("a finished run"),
            },
            "missedSchedules": integer("slots not run because they were past startingDeadlineSeconds or forbidden"),
            "lastMissedTime": string("last missed slot", format="date-time"),
            "retention": obj(
                "what the retention policy deleted",
                {"deletedTotal": integer("backups deleted so far"), "lastDeleted": strlist("ids deleted last time")},
            ),
            "restoreDrill": restore_drill_status_schema(),
            "progress": progress_schema(),
            "kopf": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    )


def schedule_fields() -> dict[str, Any]:
    """When runs start: the cron, its time zone, suspension, concurrency and Job history limits."""
    return {
        "schedule": string(
            CRON_MESSAGE.replace("must be", "is"),
            minLength=1,
            maxLength=128,
            **{"x-kubernetes-validations": [{"rule": f"self.matches('{CRON_RE}')", "message": CRON_MESSAGE}]},
        ),
        "timeZone": string(
            "IANA time zone of the schedule (default UTC), e.g. Europe/Berlin",
            pattern=r"^[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*$",
            maxLength=64,
        ),
        "suspend": boolean("stop scheduling new runs (running ones finish; on-demand still works)", default=False),
        "concurrencyPolicy": string(
            "a due run while one is active: Forbid skips it, Allow runs both, Replace stops the old one",
            enum=["Forbid", "Allow", "Replace"],
            default="Forbid",
        ),
        "startingDeadlineSeconds": integer(
            "a slot missed by more than this (operator down) is recorded as missed, not run", minimum=0
        ),
        "successfulJobsHistoryLimit": integer("finished successful Jobs kept", minimum=0, maximum=100, default=3),
        "failedJobsHistoryLimit": integer("finished failed Jobs kept", minimum=0, maximum=100, default=3),
    }


def retention_schema() -> dict[str, Any]:
    return obj(
        "Which old complete backups this policy deletes (whole backups only; never one a kept backup's "
        "incremental streams continue, never an incomplete one). Unset: keep all.",
        {
            "keepLast": integer("keep the newest N complete backups", minimum=1),
            "keepDaily": integer("keep the newest backup of each of the last N days that have one (UTC)", minimum=0),
            "keepWeekly": integer("keep the newest backup of each of the last N ISO weeks that have one", minimum=0),
            "keepMonthly": integer("keep the newest backup of each of the last N months that have one", minimum=0),
            "maxAge": string("delete complete backups older than this, e.g. 30d, 12h, 2w", pattern=DURATION_RE),
        },
    )


def object_lock_schema() -> dict[str, Any]:
    return obj(
        "S3 Object Lock (bucket created with it): every object written once and locked; retention deletes "
        "a backup only after its lock expired",
        {"mode": string("lock mode", enum=["GOVERNANCE", "COMPLIANCE"]),
         "retainDays": {"type": "number", "minimum": 0,
                        "description": "days each object stays locked"}},
        ["mode", "retainDays"],
    )


def restore_crd() -> dict[str, Any]:
    return _crd(
        kind="RabbitMQRestore",
        plural=RESTORE_PLURAL,
        singular="rabbitmqrestore",
        short=["rbakr"],
        spec=restore_spec_schema(),
        status=restore_status_schema(),
        columns=[
            ("Phase", "string", ".status.phase", 0),
            ("Backup", "string", ".status.backupId", 0),
            ("Engine", "string", ".status.engine", 0),
            ("Restored", "integer", ".status.messages", 0),
            ("Dry-Run", "boolean", ".status.dryRun", 0),
            ("Size", "string", ".status.size", 0),
            ("Target", "string", ".status.targetVhosts", 1),
            *printer_columns("restore"),
            ("Age", "date", ".metadata.creationTimestamp", 0),
        ],
        spec_required=True,
    )


def restore_spec_schema() -> dict[str, Any]:
    return obj(
        "What to restore, from where, into which broker.",
        {
            "backupRef": obj(
                "a RabbitMQBackup in this namespace: its storage, and its broker as the default target",
                {
                    "name": k8s_name("RabbitMQBackup name"),
                    "backupId": string("backup id (default: the latest complete backup)", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"),
                },
                ["name"],
            ),
            "archiveRef": archive_ref_schema(),
            "storage": storage_schema(),
            "backupId": string(
                "backup id in spec.storage (default: the latest complete backup)",
                pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$",
            ),
            "target": broker_schema("The RabbitMQ to restore into (default: the referenced backup's broker)."),
            "encryption": encryption_schema(backup=False),
            "pitr": obj(
                "point in time window on each message's backup time: RFC 3339 or epoch milliseconds",
                {
                    "start": {"x-kubernetes-int-or-string": True, "pattern": TIME_RE, "description": "window start"},
                    "end": {"x-kubernetes-int-or-string": True, "pattern": TIME_RE, "description": "window end"},
                },
            ),
            "vhostMapping": {
                "type": "object",
                "description": "source vhost -> target vhost",
                "additionalProperties": {"type": "string", "minLength": 1},
            },
            "queueMapping": {
                "type": "object",
                "description": "source queue -> target queue",
                "additionalProperties": {"type": "string", "minLength": 1},
            },
            "queues": obj(
                "which queues of the backup to restore (default: all)",
                {"include": strlist("queue name globs"), "exclude": strlist("queue name globs"),
                 "vhosts": strlist("vhosts")},
            ),
            "restoreDefinitions": boolean("import the backup's definitions first", default=False),
            "overwriteUsers": boolean("let the definitions import replace existing users' passwords, tags and "
                                 "permissions", default=False),
            "definitionsStrict": boolean("refuse definitions the target would reject instead of adapting them",
                                    default=False),
            "transientQueues": string("transient non-exclusive queues on a target that denies them",
                                  enum=["durable", "skip"], default="durable"),
            "dryRun": boolean("report what would be published, publish nothing", default=False),
            "allowLossyTarget": boolean("publish into target queues whose max-length, message TTL or expiry (argument "
                                   "or policy) may drop, expire or dead-letter restored messages; the restore "
                                   "still fails if a target holds fewer messages than were confirmed",
                                   default=False),
            "engine": string("job, spark, or auto (spark above sparkThresholdBytes)", enum=["job", "spark", "auto"], default="auto"),
            "sparkThresholdBytes": integer("auto picks spark when the backup is larger", minimum=0, default=10 * 1024**3),
            "spark": spark_schema(),
            **pod_overrides(),
        },
        **{
            "x-kubernetes-validations": [
                {"rule": "[has(self.backupRef), has(self.storage), has(self.archiveRef)].filter(x, x).size() == 1",
                 "message": "set exactly one of spec.backupRef, spec.storage or spec.archiveRef"},
                {"rule": "has(self.backupRef) || has(self.archiveRef) || has(self.target)",
                 "message": "spec.target is required when restoring from spec.storage"},
                {"rule": "!has(self.archiveRef) || !has(self.pitr)",
                 "message": "spec.pitr: not with spec.archiveRef (set spec.archiveRef.pointInTime)"},
                {"rule": "self == oldSelf", "message": "a RabbitMQRestore is immutable: create a new one"},
            ]
        },
    )


def restore_status_schema() -> dict[str, Any]:
    return obj(
        "Observed state of the restore",
        {
            "phase": string("Pending, Running, Succeeded, Failed", enum=["Pending", "Running", "Succeeded", "Failed"]),
            "observedGeneration": integer("spec generation acted on"),
            "conditions": condition_schema(),
            "backupId": string("the backup being restored (archiveRef: the archive's newest generation)"),
            "pointInTime": string("archiveRef: every stream restored up to this instant", format="date-time"),
            "engine": string("job or spark", enum=["job", "spark"]),
            "jobName": string("Job running it"),
            "sparkApplicationName": string("SparkApplication running it"),
            "startTime": string("start", format="date-time"),
            "completionTime": string("end", format="date-time"),
            "durationSeconds": {"type": "number", "description": "wall time"},
            "messages": integer("messages restored: published and confirmed by the target (0 in a dry run)"),
            "publishedMessages": integer("messages published to the target"),
            "confirmedMessages": integer("messages the target confirmed"),
            "wouldPublish": integer("a dry run: the messages a restore would publish"),
            "dryRun": {"type": "boolean", "description": "a dry run: nothing was published"},
            "targetVhosts": {"type": "array", "items": {"type": "string"}, "description": "the vhosts restored into"},
            "targetQueues": {"type": "array", "items": {"type": "string"},
                             "description": "the queues restored into, as vhost/queue (at most 50)"},
            "failedQueues": {"type": "array", "items": {"type": "string"}, "description": "target queues that failed"},
            "backupMessages": integer("messages in the backup (from manifest.json)"),
            "bytes": integer("stored bytes of the backup"),
            "size": string("stored size, human readable"),
            "reason": string("why it ended so"),
            "message": string("details"),
            "progress": progress_schema(),
            "kopf": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    )


def _crd(*, kind: str, plural: str, singular: str, short: list[str], spec: dict, status: dict,
         columns: list[tuple[str, str, str, int]], spec_required: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "rbak"}},
        "spec": {
            "group": GROUP,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": singular, "shortNames": short},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": n, "type": t, "jsonPath": p, **({"priority": pr} if pr else {})}
                        for n, t, p, pr in columns
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": f"{kind} (rbak operator)",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                            **({"required": ["spec"]} if spec_required else {}),
                        }
                    },
                }
            ],
        },
    }


def archive_crd() -> dict[str, Any]:
    return _crd(kind="RabbitMQArchive", plural=ARCHIVE_PLURAL, singular="rabbitmqarchive", short=["rmqarchive"],
                spec=archive_spec_schema(), status=archive_status_schema(), columns=ARCHIVE_COLUMNS)


def all_crds() -> dict[str, dict[str, Any]]:
    """File name under crds/ -> CRD object."""
    return {f"{BACKUP_PLURAL}.yaml": backup_crd(), f"{RESTORE_PLURAL}.yaml": restore_crd(),
            f"{ARCHIVE_PLURAL}.yaml": archive_crd()}


def render(crd: dict[str, Any]) -> str:
    header = "# Generated by `python -m rbak_operator.crds.schema crds/` from operator/rbak_operator/crds/schema.py: edit there.\n"
    return header + yaml.safe_dump(crd, sort_keys=False, width=120, allow_unicode=True)


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "crds")
    out.mkdir(parents=True, exist_ok=True)
    for name, crd in all_crds().items():
        (out / name).write_text(render(crd))
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
