"""Building blocks of the CRD schemas: typed field helpers, validation patterns, and the fragments
both CRDs share (broker, storage, encryption, pod overrides, Spark, conditions, run summaries)."""

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


def _s(desc: str, **kw: Any) -> dict[str, Any]:
    return {"type": "string", "description": desc, **kw}


def _i(desc: str, **kw: Any) -> dict[str, Any]:
    return {"type": "integer", "description": desc, **kw}


def _b(desc: str, **kw: Any) -> dict[str, Any]:
    return {"type": "boolean", "description": desc, **kw}


def _obj(desc: str, props: dict[str, Any], required: list[str] | None = None, /, **kw: Any) -> dict[str, Any]:
    o: dict[str, Any] = {"type": "object", "description": desc, "properties": props}
    if required:
        o["required"] = required
    o.update(kw)
    return o


def _strlist(desc: str, **item: Any) -> dict[str, Any]:
    return {"type": "array", "description": desc, "items": {"type": "string", **item}}


def _name(desc: str) -> dict[str, Any]:
    return _s(desc, minLength=1, maxLength=253, pattern=K8S_NAME_RE)


def broker_schema(desc: str) -> dict[str, Any]:
    return _obj(
        desc,
        {
            "rabbitmqClusterReference": _obj(
                "A RabbitmqCluster of the RabbitMQ cluster operator (by name: its default-user Secret, named in "
                "status.defaultUser.secretReference, else '<name>-default-user', gives username, password, host "
                "and port), or, as the messaging-topology-operator takes it, a connectionSecret holding the keys "
                "uri (management API URL), username and password. Set exactly one of name or connectionSecret.",
                {
                    "name": _name("RabbitmqCluster name"),
                    "namespace": _name("its namespace (default: this object's)"),
                    "connectionSecret": _obj("Secret with keys uri, username, password",
                                             {"name": _name("Secret name")}, ["name"]),
                    "managementPort": _i("management API port (by name)", minimum=1, maximum=65535, default=15672),
                    "managementScheme": _s("http or https (by name)", enum=["http", "https"], default="http"),
                    "amqpPort": _i("AMQP port on the uri's host (connectionSecret)", minimum=1, maximum=65535,
                                   default=5672),
                },
                **{"x-kubernetes-validations": [{
                    "rule": "has(self.name) != has(self.connectionSecret)",
                    "message": "set exactly one of rabbitmqClusterReference.name or rabbitmqClusterReference.connectionSecret",
                }]},
            ),
            "amqpUrl": _s(
                "AMQP URL without credentials, e.g. amqp://rabbitmq.ns.svc:5672/%2f",
                pattern=r"^amqps?://[^@\s]+$",
            ),
            "managementUrl": _s("management API base URL, e.g. http://rabbitmq.ns.svc:15672", pattern=r"^https?://\S+$"),
            "credentialsSecretRef": _obj(
                "Secret holding the broker user; the values reach the pod as env vars, never the spec or a ConfigMap.",
                {
                    "name": _name("Secret name"),
                    "usernameKey": _s("key of the username", default="username", minLength=1),
                    "passwordKey": _s("key of the password", default="password", minLength=1),
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
    return _obj(
        "Where backups are stored: S3 (or compatible) or a PersistentVolumeClaim.",
        {
            "s3": _obj(
                "S3 bucket",
                {
                    "bucket": _s("bucket name", minLength=3, maxLength=63),
                    "prefix": _s("key prefix inside the bucket", default="", pattern=r"^[^\s]*$"),
                    "region": _s("region", default="us-east-1"),
                    "endpoint": _s("endpoint URL for S3-compatible stores", pattern=r"^https?://\S+$"),
                    "pathStyle": _b("path-style addressing (MinIO, Ceph)", default=False),
                    "credentialsSecretRef": _obj(
                        "Secret with the access key; omit to use the pod's identity (IRSA, instance role)",
                        {
                            "name": _name("Secret name"),
                            "accessKeyIdKey": _s("key of the access key id", default="AWS_ACCESS_KEY_ID"),
                            "secretAccessKeyKey": _s("key of the secret key", default="AWS_SECRET_ACCESS_KEY"),
                        },
                        ["name"],
                    ),
                },
                ["bucket"],
            ),
            "pvc": _obj(
                "PersistentVolumeClaim mounted into the run's pod",
                {
                    "claimName": _name("claim name"),
                    "path": _s("directory inside the volume", default="backups", pattern=r"^[^\s]*$"),
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
        "keysSecretRef": _obj(
            "Secret holding the keyring: YAML {key id: base64 32-byte key}, old ids kept so old backups stay readable",
            {"name": _name("Secret name (same namespace)"), "key": _s("data key of the keyring (default keyring)")},
            ["name"],
        ),
    }
    if backup:
        props["keyId"] = _s("key id new backups are encrypted with (recorded in each manifest)", minLength=1,
                            maxLength=255)
        props["envelope"] = _b("envelope encryption: each backup gets its own data key, wrapped by keyId and/or "
                               "kms.keyId, so keys rotate with `rbak keys rewrap` without re-encrypting backups")
        props["kms"] = _obj(
            "an AWS KMS key that wraps each backup's data key (envelope only); the pod's AWS credentials "
            "(IRSA, or the storage Secret's keys) need kms:Encrypt, restores kms:Decrypt. region and "
            "endpointUrl reach every pod the operator runs for this backup (backup, validation, drill) and "
            "RabbitMQRestores of it through backupRef",
            {"keyId": _s("KMS key id, ARN or alias/...", minLength=1),
             "region": _s("KMS region (default the ARN's)", minLength=1),
             "endpointUrl": _s("KMS endpoint URL (default AWS; pods get it as AWS_ENDPOINT_URL_KMS too)",
                               pattern="^https?://")},
            ["keyId"],
        )
        props["serverSide"] = _obj(
            "S3 server-side encryption of every object put",
            {"mode": _s("SSE-S3 (AES256) or SSE-KMS (aws:kms)", enum=["AES256", "aws:kms"]),
             "kmsKeyId": _s("KMS key id or ARN (aws:kms only)")},
            ["mode"],
        )
        desc = ("client-side encryption (rbak's extension of the format): set keyId and keysSecretRef to encrypt; "
                "serverSide alone only asks S3 to encrypt")
    else:
        props["kms"] = _obj(
            "how to reach AWS KMS to unwrap an envelope backup's data key (each wrap object names its key); "
            "default: the referenced RabbitMQBackup's spec.encryption.kms",
            {"region": _s("KMS region (default the one the wrap object records)", minLength=1),
             "endpointUrl": _s("KMS endpoint URL (default AWS; the pod gets it as AWS_ENDPOINT_URL_KMS too)",
                               pattern="^https?://")},
        )
        desc = ("keys of an encrypted backup; keysSecretRef and kms each default to the referenced "
                "RabbitMQBackup's")
    return _obj(desc, props)


def pod_overrides() -> dict[str, Any]:
    return {
        "image": _s("container image running rbak (default: the operator's RBAK_IMAGE)", minLength=1),
        "imagePullPolicy": _s("image pull policy", enum=["Always", "IfNotPresent", "Never"]),
        "serviceAccountName": _name("service account of the run's pod"),
        "resources": {
            "type": "object",
            "description": "container resources (requests/limits)",
            "properties": {
                "requests": {"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": True}},
                "limits": {"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": True}},
            },
        },
        "activeDeadlineSeconds": _i("kill a run after this many seconds", minimum=1),
    }


def spark_schema() -> dict[str, Any]:
    return _obj(
        "SparkApplication settings (spark-operator, sparkoperator.k8s.io/v1beta2)",
        {
            "image": _s("Spark image with rbak and spark/ installed"),
            "sparkVersion": _s("Spark version", default="4.0.0"),
            "serviceAccount": _name("driver service account"),
            "executorInstances": _i("executors", minimum=1, default=2),
            "executorCores": _i("cores per executor", minimum=1, default=1),
            "executorMemory": _s("executor memory", default="1g", pattern=r"^[0-9]+[kmgtKMGT]?$"),
            "driverMemory": _s("driver memory", default="1g", pattern=r"^[0-9]+[kmgtKMGT]?$"),
        },
    )


def condition_schema() -> dict[str, Any]:
    return {
        "type": "array",
        "description": "metav1.Condition-style conditions",
        "items": _obj(
            "condition",
            {
                "type": _s("Ready, Progressing, Completed, ..."),
                "status": _s("True, False or Unknown", enum=["True", "False", "Unknown"]),
                "reason": _s("CamelCase reason"),
                "message": _s("human message"),
                "lastTransitionTime": _s("when status last changed", format="date-time"),
                "observedGeneration": _i("generation this condition was set for"),
            },
            ["type", "status"],
        ),
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    }


def run_summary_schema(desc: str) -> dict[str, Any]:
    return _obj(
        desc,
        {
            "backupId": _s("backup id (the storage folder)"),
            "jobName": _s("Job running it"),
            "trigger": _s("schedule or manual", enum=["schedule", "manual"]),
            "phase": _s("Running, Succeeded or Failed", enum=["Running", "Succeeded", "Failed"]),
            "reason": _s("why it ended so"),
            "message": _s("details"),
            "scheduledTime": _s("slot time", format="date-time"),
            "startTime": _s("start", format="date-time"),
            "completionTime": _s("end", format="date-time"),
            "durationSeconds": {"type": "number", "description": "wall time"},
            "messages": _i("messages in the backup (from manifest.json)"),
            "bytes": _i("stored bytes (from manifest.json)"),
            "size": _s("stored size, human readable"),
            "segments": _i("segments (from manifest.json)"),
            "queues": _i("queues (from manifest.json)"),
            "backupState": _s("complete, or partial when some queue was refused, failed or read short of its depth (manifest.json)",
                              enum=["complete", "partial", "incomplete"]),
            "partialQueues": _strlist("queues not backed up, each 'vhost/name (status): reason'"),
            "heldByConsumers": _i("messages consumers held unacknowledged when the backup listed their queues: "
                                  "not in the backup"),
            "heldQueues": _strlist("the queues with messages held by consumers, each 'vhost/name (N)'"),
            "gapMessages": _i("stream messages removed by the stream's retention before this backup read them"),
            "gaps": _strlist("stream gaps: 'vhost/name offsets A..B (N messages)'"),
            "validation": _s("validation outcome", enum=["Skipped", "Passed", "Failed", "Pending"]),
            "validationRun": _s("Job or SparkApplication validating this backup after the run"),
            "validationEngine": _s("job or spark", enum=["job", "spark"]),
        },
    )
