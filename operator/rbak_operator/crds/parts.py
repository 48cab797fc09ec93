"""Building blocks of the CRD schemas: typed field helpers, validation patterns, the fragments both CRDs
share (broker, storage, encryption, pod overrides, Spark, conditions, run summaries, live progress and its
printer columns) and the restore drill's (``spec.verify``, ``status.restoreDrill``); ``schema`` places them."""

from __future__ import annotations

from typing import Any

# A standard 5-field cron or a macro. Six fields (seconds first, as in
# CloudNativePG) is refused: it silently means something else. The CEL rule puts
# this regex inside a single-quoted CEL string, where `\s`/`\S` are invalid escapes
# (the API server refuses the whole CRD): blanks are spaces or tabs, and `\t` is an
# escape both CEL and Python's re read as a tab.
CRON_RE = r"^[ \t]*(@(yearly|annually|monthly|weekly|daily|hourly)|[^ \t]+([ \t]+[^ \t]+){4})[ \t]*$"
CRON_MESSAGE = (
    "schedule must be a standard 5-field cron expression 'minute hour day-of-month month day-of-week' "
    "(or @hourly/@daily/@weekly/@monthly/@yearly); 6-field values with a leading seconds field are not supported"
)
DURATION_RE = r"^[0-9]+(s|m|h|d|w)$"
TIME_RE = r"^([0-9]{1,15}|[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2}))$"
K8S_NAME_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def string(desc: str, **kw: Any) -> dict[str, Any]:
    return {"type": "string", "description": desc, **kw}


def integer(desc: str, **kw: Any) -> dict[str, Any]:
    return {"type": "integer", "description": desc, **kw}


def boolean(desc: str, **kw: Any) -> dict[str, Any]:
    return {"type": "boolean", "description": desc, **kw}


def obj(desc: str, props: dict[str, Any], required: list[str] | None = None, /, **kw: Any) -> dict[str, Any]:
    o: dict[str, Any] = {"type": "object", "description": desc, "properties": props}
    if required:
        o["required"] = required
    o.update(kw)
    return o


def strlist(desc: str, **item: Any) -> dict[str, Any]:
    return {"type": "array", "description": desc, "items": {"type": "string", **item}}


def k8s_name(desc: str) -> dict[str, Any]:
    return string(desc, minLength=1, maxLength=253, pattern=K8S_NAME_RE)


def broker_schema(desc: str) -> dict[str, Any]:
    return obj(
        desc,
        {
            "rabbitmqClusterReference": obj(
                "A RabbitmqCluster of the RabbitMQ cluster operator (by name: its default-user Secret, named in "
                "status.defaultUser.secretReference, else '<name>-default-user', gives username, password, host "
                "and port), or, as the messaging-topology-operator takes it, a connectionSecret holding the keys "
                "uri (management API URL), username and password. Set exactly one of name or connectionSecret.",
                {
                    "name": k8s_name("RabbitmqCluster name"),
                    "namespace": k8s_name("its namespace (default: this object's)"),
                    "connectionSecret": obj("Secret with keys uri, username, password",
                                             {"name": k8s_name("Secret name")}, ["name"]),
                    "managementPort": integer("management API port (by name)", minimum=1, maximum=65535, default=15672),
                    "managementScheme": string("http or https (by name)", enum=["http", "https"], default="http"),
                    "amqpPort": integer("AMQP port on the uri's host (connectionSecret)", minimum=1, maximum=65535,
                                   default=5672),
                },
                **{"x-kubernetes-validations": [{
                    "rule": "has(self.name) != has(self.connectionSecret)",
                    "message": "set exactly one of rabbitmqClusterReference.name or rabbitmqClusterReference.connectionSecret",
                }]},
            ),
            "amqpUrl": string(
                "AMQP URL without credentials, e.g. amqp://rabbitmq.ns.svc:5672/%2f",
                pattern=r"^amqps?://[^@\s]+$",
            ),
            "managementUrl": string("management API base URL, e.g. http://rabbitmq.ns.svc:15672", pattern=r"^https?://\S+$"),
            "streamPort": integer("stream protocol port on the broker's AMQP host (streams' offsets are read there; "
                                  "default 5552)", minimum=1, maximum=65535),
            "credentialsSecretRef": obj(
                "Secret holding the broker user; the values reach the pod as env vars, never the spec or a ConfigMap.",
                {
                    "name": k8s_name("Secret name"),
                    "usernameKey": string("key of the username", default="username", minLength=1),
                    "passwordKey": string("key of the password", default="password", minLength=1),
                },
                ["name"],
            ),
        },
        **{
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.rabbitmqClusterReference) != has(self.amqpUrl)",
                    "message": "set exactly one of broker.rabbitmqClusterReference or broker.amqpUrl",
                },
                {
                    "rule": "!has(self.amqpUrl) || (has(self.managementUrl) && has(self.credentialsSecretRef))",
                    "message": "broker.amqpUrl needs broker.managementUrl and broker.credentialsSecretRef",
                },
            ]
        },
    )


def storage_schema() -> dict[str, Any]:
    return obj(
        "Where backups are stored: S3 (or compatible) or a PersistentVolumeClaim.",
        {
            "s3": obj(
                "S3 bucket",
                {
                    "bucket": string("bucket name", minLength=3, maxLength=63),
                    "prefix": string("key prefix inside the bucket", default="", pattern=r"^[^\s]*$"),
                    "region": string("region", default="us-east-1"),
                    "endpoint": string("endpoint URL for S3-compatible stores", pattern=r"^https?://\S+$"),
                    "pathStyle": boolean("path-style addressing (MinIO, Ceph)", default=False),
                    "credentialsSecretRef": obj(
                        "Secret with the access key; omit to use the pod's identity (IRSA, instance role)",
                        {
                            "name": k8s_name("Secret name"),
                            "accessKeyIdKey": string("key of the access key id", default="AWS_ACCESS_KEY_ID"),
                            "secretAccessKeyKey": string("key of the secret key", default="AWS_SECRET_ACCESS_KEY"),
                        },
                        ["name"],
                    ),
                },
                ["bucket"],
            ),
            "pvc": obj(
                "PersistentVolumeClaim mounted into the run's pod",
                {
                    "claimName": k8s_name("claim name"),
                    "path": string("directory inside the volume", default="backups", pattern=r"^[^\s]*$"),
                },
                ["claimName"],
            ),
        },
        **{
            "x-kubernetes-validations": [
                {"rule": "has(self.s3) != has(self.pvc)", "message": "set exactly one of storage.s3 or storage.pvc"}
            ]
        },
    )


def encryption_schema(backup: bool) -> dict[str, Any]:
    """spec.encryption: client-side AES-256-GCM keys from a Secret (and, for backups, S3 SSE)."""
    props: dict[str, Any] = {
        "keysSecretRef": obj(
            "Secret holding the keyring: YAML {key id: base64 32-byte key}, old ids kept so old backups stay readable",
            {"name": k8s_name("Secret name (same namespace)"), "key": string("data key of the keyring (default keyring)")},
            ["name"],
        ),
    }
    if backup:
        props["keyId"] = string("key id new backups are encrypted with (recorded in each manifest)", minLength=1,
                            maxLength=255)
        props["envelope"] = boolean("envelope encryption: each backup gets its own data key, wrapped by keyId and/or "
                               "kms.keyId, so keys rotate with `rbak keys rewrap` without re-encrypting backups")
        props["kms"] = obj(
            "an AWS KMS key that wraps each backup's data key (envelope only); the pod's AWS credentials "
            "(IRSA, or the storage Secret's keys) need kms:Encrypt, restores kms:Decrypt. region and "
            "endpointUrl reach every pod the operator runs for this backup (backup, validation, drill) and "
            "RabbitMQRestores of it through backupRef",
            {"keyId": string("KMS key id, ARN or alias/...", minLength=1),
             "region": string("KMS region (default the ARN's)", minLength=1),
             "endpointUrl": string("KMS endpoint URL (default AWS; pods get it as AWS_ENDPOINT_URL_KMS too)",
                               pattern="^https?://")},
            ["keyId"],
        )
        props["serverSide"] = obj(
            "S3 server-side encryption of every object put",
            {"mode": string("SSE-S3 (AES256) or SSE-KMS (aws:kms)", enum=["AES256", "aws:kms"]),
             "kmsKeyId": string("KMS key id or ARN (aws:kms only)")},
            ["mode"],
        )
        desc = ("client-side encryption (rbak's extension of the format): set keyId and keysSecretRef to encrypt; "
                "serverSide alone only asks S3 to encrypt")
    else:
        props["kms"] = obj(
            "how to reach AWS KMS to unwrap an envelope backup's data key (each wrap object names its key); "
            "default: the referenced RabbitMQBackup's spec.encryption.kms",
            {"region": string("KMS region (default the one the wrap object records)", minLength=1),
             "endpointUrl": string("KMS endpoint URL (default AWS; the pod gets it as AWS_ENDPOINT_URL_KMS too)",
                               pattern="^https?://")},
        )
        desc = ("keys of an encrypted backup; keysSecretRef and kms each default to the referenced "
                "RabbitMQBackup's")
    return obj(desc, props)


def pod_overrides() -> dict[str, Any]:
    return {
        "image": string("container image running rbak (default: the operator's RBAK_IMAGE)", minLength=1),
        "imagePullPolicy": string("image pull policy", enum=["Always", "IfNotPresent", "Never"]),
        "serviceAccountName": k8s_name("service account of the run's pod"),
        "resources": {
            "type": "object",
            "description": "container resources (requests/limits)",
            "properties": {
                "requests": {"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": True}},
                "limits": {"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": True}},
            },
        },
        "activeDeadlineSeconds": integer("kill a run after this many seconds", minimum=1),
    }


def spark_schema() -> dict[str, Any]:
    return obj(
        "SparkApplication settings (spark-operator, sparkoperator.k8s.io/v1beta2)",
        {
            "image": string("Spark image with rbak and spark/ installed"),
            "sparkVersion": string("Spark version", default="4.0.0"),
            "serviceAccount": k8s_name("driver service account"),
            "executorInstances": integer("executors", minimum=1, default=2),
            "executorCores": integer("cores per executor", minimum=1, default=1),
            "executorMemory": string("executor memory", default="1g", pattern=r"^[0-9]+[kmgtKMGT]?$"),
            "driverMemory": string("driver memory", default="1g", pattern=r"^[0-9]+[kmgtKMGT]?$"),
        },
    )


def condition_schema() -> dict[str, Any]:
    return {
        "type": "array",
        "description": "metav1.Condition-style conditions",
        "items": obj(
            "condition",
            {
                "type": string("Ready, Progressing, Completed, ..."),
                "status": string("True, False or Unknown", enum=["True", "False", "Unknown"]),
                "reason": string("CamelCase reason"),
                "message": string("human message"),
                "lastTransitionTime": string("when status last changed", format="date-time"),
                "observedGeneration": integer("generation this condition was set for"),
            },
            ["type", "status"],
        ),
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    }


def run_summary_schema(desc: str) -> dict[str, Any]:
    return obj(
        desc,
        {
            "backupId": string("backup id (the storage folder)"),
            "jobName": string("Job running it"),
            "trigger": string("schedule or manual", enum=["schedule", "manual"]),
            "phase": string("Running, Succeeded or Failed", enum=["Running", "Succeeded", "Failed"]),
            "reason": string("why it ended so"),
            "message": string("details"),
            "scheduledTime": string("slot time", format="date-time"),
            "startTime": string("start", format="date-time"),
            "completionTime": string("end", format="date-time"),
            "durationSeconds": {"type": "number", "description": "wall time"},
            "messages": integer("messages in the backup (from manifest.json)"),
            "bytes": integer("stored bytes (from manifest.json)"),
            "size": string("stored size, human readable"),
            "segments": integer("segments (from manifest.json)"),
            "queues": integer("queues (from manifest.json)"),
            "backupState": string("complete, or partial when some queue was refused, failed or read short of its depth (manifest.json)",
                              enum=["complete", "partial", "incomplete"]),
            "partialQueues": strlist("queues not backed up, each 'vhost/name (status): reason'"),
            "heldByConsumers": integer("messages consumers held unacknowledged when the backup listed their queues: "
                                  "not in the backup"),
            "heldQueues": strlist("the queues with messages held by consumers, each 'vhost/name (N)'"),
            "gapMessages": integer("stream messages removed by the stream's retention before this backup read them"),
            "gaps": strlist("stream gaps: 'vhost/name offsets A..B (N messages)'"),
            "validation": string("validation outcome", enum=["Skipped", "Passed", "Failed", "Pending"]),
            "validationRun": string("Job or SparkApplication validating this backup after the run"),
            "validationEngine": string("job or spark", enum=["job", "spark"]),
        },
    )


# --------------------------------------------------------------------------
# RabbitMQBackup.spec.verify (restore drills) and status.restoreDrill
# --------------------------------------------------------------------------

def verify_schema() -> dict[str, Any]:
    cron = string(CRON_MESSAGE.replace("must be", "is") + " (the drill's own schedule)", minLength=1, maxLength=128,
              **{"x-kubernetes-validations": [{"rule": f"self.matches('{CRON_RE}')", "message": CRON_MESSAGE}]})
    drill = obj(
        "Restore drills: on their own schedule, restore the newest complete backup into a scratch vhost on the "
        "target, compare per-queue message counts and record hashes with the backup, delete the scratch vhost, "
        "and record the result in status.restoreDrill, an event and the metrics. Never touches the source vhosts.",
        {
            "enabled": boolean("run drills on the schedule", default=True),
            "schedule": cron,
            "target": broker_schema("Broker the scratch vhost is created on (default: spec.broker). Its user needs "
                                    "the administrator tag (it creates and deletes a vhost)."),
            "readTimeoutSeconds": integer("reading a scratch queue back stops after this long without a message",
                                     minimum=1, maximum=3600),
            "startingDeadlineSeconds": integer("a drill slot missed by more than this is skipped", minimum=0),
            "activeDeadlineSeconds": integer("kill a drill Job after this many seconds", minimum=1),
            "signingKeySecretRef": obj(
                "Ed25519 private key (PEM) that signs each drill report (rbak drill verify checks it)",
                {"name": string("Secret in the object's namespace", minLength=1),
                 "key": string("key in the Secret holding the PEM", default="signing.pem", minLength=1)},
                ["name"],
            ),
        },
        ["schedule"],
    )
    return obj("Checks beyond validation", {"restoreDrill": drill})


def restore_drill_status_schema() -> dict[str, Any]:
    return obj(
        "The last restore drill (spec.verify.restoreDrill)",
        {
            "result": string("outcome of the last drill", enum=["Passed", "Failed", "Skipped"]),
            "reason": string("DrillPassed, DrillFailed, NoBackup, InvalidSpec, DrillEvidenceInvalid (the signed "
                         "report does not verify, at the drill or on a later check), DrillEvidenceMissing (it "
                         "was removed from the storage) or the Job's failure reason"),
            "message": string("details: the first queue that did not match, or the Job's error"),
            "backupId": string("backup drilled"),
            "lastJob": string("Job of the last recorded drill"),
            "lastRunTime": string("end of the last drill", format="date-time"),
            "durationSeconds": {"type": "number", "description": "wall time of the last drill"},
            "scratchVhost": string("the scratch vhost it used (deleted)"),
            "queues": integer("queues compared"),
            "messages": integer("messages restored and read back"),
            "failedQueues": strlist("queues that did not match, 'vhost/name'"),
            "active": string("drill Job running now"),
            "lastScheduleTime": string("last drill slot acted on", format="date-time"),
            "nextRunTime": string("next drill slot", format="date-time"),
            "recordedJobs": strlist("drill Jobs already recorded (newest last)"),
            "lastManualTrigger": string("value of the rbak.io/drill-now annotation last run"),
            "signer": string("SHA256:<hex> fingerprint of the key that signed the last drill report, shown only "
                         "while the stored report verifies"),
            "evidenceCheckTime": string("when the operator last verified the stored signed report again (hourly; "
                                    "RBAK_OPERATOR_EVIDENCE_RECHECK_SECONDS)", format="date-time"),
        },
    )


# --------------------------------------------------------------------------
# status.progress (both CRDs) and its kubectl columns
# --------------------------------------------------------------------------

def progress_schema() -> dict[str, Any]:
    s = lambda d, **kw: {"type": "string", "description": d, **kw}  # noqa: E731
    i = lambda d: {"type": "integer", "description": d}  # noqa: E731
    return {
        "type": "object",
        "description": "live progress of the running Job (from its progress records in the storage); "
                       "removed when the run ends",
        "properties": {
            "runName": s("the run (Job) reporting"),
            "state": s("Running, Finished or Failed", enum=["Running", "Finished", "Failed"]),
            "summary": s("queues done of total and messages, e.g. '3/10 queues, 12000 msgs (40%)'"),
            "queues": s("queues done / total"),
            "queuesDone": i("queues finished"),
            "queuesTotal": i("queues in the run"),
            "messages": i("messages read (backup) or confirmed (restore) so far"),
            "messagesTotal": i("messages expected, when known"),
            "percent": i("messages / messagesTotal in percent"),
            "bytes": i("message body bytes so far"),
            "size": s("bytes, human readable"),
            "rate": s("recent messages per second, human readable"),
            "messagesPerSecond": {"type": "number", "description": "recent messages per second"},
            "currentQueue": s("the queue being worked on (vhost/name)"),
            "startTime": s("when the run started", format="date-time"),
            "updateTime": s("when the Job wrote this", format="date-time"),
        },
    }


def printer_columns(kind: str) -> list[tuple[str, str, str, int]]:
    """(name, type, jsonPath, priority) of the progress columns of ``kubectl get``."""
    return [
        ("Progress", "string", ".status.progress.summary", 0),
        ("Rate", "string", ".status.progress.rate", 0),
        ("Current Queue", "string", ".status.progress.currentQueue", 1),
        ("Transferred", "string", ".status.progress.size", 1),
    ]


