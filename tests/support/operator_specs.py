"""RabbitMQBackup specs and constants the operator's logic tests share."""

from __future__ import annotations

import re
from datetime import datetime, timezone


K8S = "1.33"


DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


SLOT = datetime(2026, 11, 22, 23, 0, tzinfo=timezone.utc)


OWNER = {"apiVersion": "rbak.io/v1alpha1", "kind": "RabbitMQBackup",
         "metadata": {"name": "nightly", "namespace": "prod", "uid": "0b7c6a3e-1111-2222-3333-444455556666"}}


SECRET_ENV = {"RBAK_BROKER_USERNAME": "u", "RBAK_BROKER_PASSWORD": "p", "RBAK_BROKER_HOST": "rmq.prod.svc",
              "RBAK_BROKER_PORT": "5672", "RBAK_STATE_DIR": "/var/run/rbak"}


CLUSTER_SPEC = {
    "broker": {"rabbitmqClusterReference": {"name": "rmq"}},
    "queues": {"vhosts": ["/"], "exclude": ["tmp.*"], "types": ["classic", "quorum"], "minMessages": 1},
    "storage": {"s3": {"bucket": "backups", "prefix": "rmq/prod", "region": "eu-west-1",
                       "endpoint": "http://minio:9000", "pathStyle": True,
                       "credentialsSecretRef": {"name": "s3-creds"}}},
    "compression": "lz4", "segmentMaxBytes": 1048576, "segmentMaxIntervalMs": 30000,
    "resources": {"limits": {"memory": "512Mi", "cpu": "1"}, "requests": {"cpu": 0.1}},
    "serviceAccountName": "rbak-runner", "activeDeadlineSeconds": 3600,
}


URL_SPEC = {
    "broker": {"amqpUrl": "amqps://rmq.example.com:5671/%2f", "managementUrl": "https://rmq.example.com:15671",
               "credentialsSecretRef": {"name": "rmq-user", "usernameKey": "user", "passwordKey": "pass"}},
    "storage": {"pvc": {"claimName": "rbak-data", "path": "rmq"}},
}
