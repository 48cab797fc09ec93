#!/usr/bin/env bash
# rbak on a local kind cluster, end to end: build the image, create the cluster,
# install the RabbitMQ cluster operator, a RabbitMQ cluster, MinIO and rbak (Helm),
# publish a few messages, apply the examples and wait for a completed backup.
#
# For a machine with Docker (it cannot run in the project's CI, which has no
# Docker; the CI shellchecks it). Needs: docker, kind, kubectl (>= 1.23), helm 3.
#
#   examples/kind/up.sh                  # everything; ~5 minutes on a laptop
#   examples/kind/up.sh --with-restore   # then also restore that backup into a new queue
#   KEEP=0 examples/kind/up.sh           # delete the cluster at the end
#
# Re-running is safe: existing pieces are reused.
set -euo pipefail

CLUSTER=${CLUSTER:-rbak}
IMAGE=${IMAGE:-rbak:dev}
RABBITMQ_OPERATOR_VERSION=${RABBITMQ_OPERATOR_VERSION:-v2.15.0}
RABBITMQ_IMAGE=${RABBITMQ_IMAGE:-rabbitmq:4.0.5-management}
MINIO_IMAGE=${MINIO_IMAGE:-minio/minio:RELEASE.2025-09-07T16-13-09Z}
NAMESPACE=${NAMESPACE:-messaging}
TIMEOUT=${TIMEOUT:-600s}
KEEP=${KEEP:-1}
WITH_RESTORE=0

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

log() { printf '\n==> %s\n' "$*"; }
die() { printf 'up.sh: %s\n' "$*" >&2; exit 1; }

for arg in "$@"; do
    case "$arg" in
        --with-restore) WITH_RESTORE=1 ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) die "unknown argument: $arg (see --help)" ;;
    esac
done

for tool in docker kind kubectl helm; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is required but not installed"
done
docker info >/dev/null 2>&1 || die "docker is installed but not running (or not usable by $(id -un))"

cleanup() {
    if [ "$KEEP" = "0" ]; then
        log "deleting kind cluster $CLUSTER (KEEP=0)"
        kind delete cluster --name "$CLUSTER" || true
    fi
}
trap cleanup EXIT

log "building $IMAGE from $REPO"
docker build -t "$IMAGE" --target runtime "$REPO"

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "reusing kind cluster $CLUSTER"
else
    log "creating kind cluster $CLUSTER"
    kind create cluster --name "$CLUSTER" --wait 120s
fi
kubectl config use-context "kind-$CLUSTER" >/dev/null
kind load docker-image "$IMAGE" --name "$CLUSTER"

log "RabbitMQ cluster operator $RABBITMQ_OPERATOR_VERSION"
kubectl apply -f "https://github.com/rabbitmq/cluster-operator/releases/download/${RABBITMQ_OPERATOR_VERSION}/cluster-operator.yml"
kubectl -n rabbitmq-system rollout status deploy/rabbitmq-cluster-operator --timeout="$TIMEOUT"

log "RabbitmqCluster $NAMESPACE/rabbitmq ($RABBITMQ_IMAGE)"
kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
kubectl apply -f - <<YAML
apiVersion: rabbitmq.com/v1beta1
kind: RabbitmqCluster
metadata:
  name: rabbitmq
  namespace: $NAMESPACE
spec:
  replicas: 1
  image: $RABBITMQ_IMAGE
  resources:
    requests: {cpu: 200m, memory: 512Mi}
    limits: {memory: 1Gi}
YAML
# The StatefulSet appears a moment after the RabbitmqCluster.
for _ in $(seq 60); do
    kubectl -n "$NAMESPACE" get statefulset rabbitmq-server >/dev/null 2>&1 && break
    sleep 2
done
kubectl -n "$NAMESPACE" rollout status statefulset/rabbitmq-server --timeout="$TIMEOUT"

log "MinIO ($MINIO_IMAGE) with bucket rabbitmq-backups"
MINIO_USER=rbak-minio
MINIO_PASSWORD=$(head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 24)
kubectl create namespace minio --dry-run=client -o yaml | kubectl apply -f -
if ! kubectl -n minio get secret minio >/dev/null 2>&1; then
    kubectl -n minio create secret generic minio \
        --from-literal=MINIO_ROOT_USER="$MINIO_USER" --from-literal=MINIO_ROOT_PASSWORD="$MINIO_PASSWORD"
fi
MINIO_PASSWORD=$(kubectl -n minio get secret minio -o jsonpath='{.data.MINIO_ROOT_PASSWORD}' | base64 -d)
kubectl apply -f - <<YAML
apiVersion: apps/v1
kind: Deployment
metadata:
  name: minio
  namespace: minio
spec:
  replicas: 1
  selector:
    matchLabels: {app: minio}
  template:
    metadata:
      labels: {app: minio}
    spec:
      containers:
        - name: minio
          image: $MINIO_IMAGE
          args: [server, /data]
          envFrom:
            - secretRef: {name: minio}
          ports:
            - containerPort: 9000
          readinessProbe:
            httpGet: {path: /minio/health/ready, port: 9000}
          volumeMounts:
            - {name: data, mountPath: /data}
      volumes:
        - name: data
          emptyDir: {}
---
apiVersion: v1
kind: Service
metadata:
  name: minio
  namespace: minio
spec:
  selector: {app: minio}
  ports:
    - {port: 9000, targetPort: 9000}
YAML
kubectl -n minio rollout status deploy/minio --timeout="$TIMEOUT"

# The S3 credentials the backup Jobs use (examples: credentialsSecretRef rbak-s3).
kubectl -n "$NAMESPACE" create secret generic rbak-s3 \
    --from-literal=AWS_ACCESS_KEY_ID="$MINIO_USER" --from-literal=AWS_SECRET_ACCESS_KEY="$MINIO_PASSWORD" \
    --dry-run=client -o yaml | kubectl apply -f -

# A one-off pod of the rbak image running a Python script (bucket, test messages).
run_in_image() {
    local name=$1 script=$2
    kubectl -n "$NAMESPACE" delete pod "$name" --ignore-not-found >/dev/null
    kubectl -n "$NAMESPACE" apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $name
spec:
  restartPolicy: Never
  containers:
    - name: main
      image: $IMAGE
      imagePullPolicy: Never
      command: [python, -c]
      args:
        - |
$(printf '%s\n' "$script" | sed 's/^/          /')
      envFrom:
        - secretRef: {name: rbak-s3}
        - secretRef: {name: rabbitmq-default-user}
YAML
    if ! kubectl -n "$NAMESPACE" wait --for=jsonpath='{.status.phase}'=Succeeded "pod/$name" --timeout="$TIMEOUT"; then
        kubectl -n "$NAMESPACE" logs "$name" >&2 || true
        die "pod $name did not succeed"
    fi
    kubectl -n "$NAMESPACE" delete pod "$name" >/dev/null
}

run_in_image make-bucket "
import boto3, botocore
s3 = boto3.client('s3', endpoint_url='http://minio.minio.svc:9000', region_name='us-east-1')
try:
    s3.create_bucket(Bucket='rabbitmq-backups')
except botocore.exceptions.ClientError as e:
    if e.response['Error']['Code'] not in ('BucketAlreadyOwnedByYou', 'BucketAlreadyExists'):
        raise
"

log "publishing 1000 test messages to queue 'orders'"
run_in_image publish "
import os, pika
url = 'amqp://%s:%s@rabbitmq.$NAMESPACE.svc:5672/%%2f' % (os.environ['username'], os.environ['password'])
conn = pika.BlockingConnection(pika.URLParameters(url))
ch = conn.channel()
ch.confirm_delivery()
ch.queue_declare('orders', durable=True)
for i in range(1000):
    ch.basic_publish('', 'orders', b'order %d' % i, pika.BasicProperties(delivery_mode=2))
conn.close()
"

log "installing rbak (charts/rbak) with image $IMAGE"
helm upgrade --install rbak "$REPO/charts/rbak" --namespace rbak-system --create-namespace \
    --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
    --set-json "watchNamespaces=[\"$NAMESPACE\"]" --wait --timeout "$TIMEOUT"

log "applying the examples (examples/kind: S3 = MinIO)"
kubectl apply -k "$REPO/examples/kind" -n "$NAMESPACE"

log "waiting for the on-demand backup to complete"
if ! kubectl -n "$NAMESPACE" wait rabbitmqbackup/on-demand \
        --for=jsonpath='{.status.lastRun.phase}'=Succeeded --timeout="$TIMEOUT"; then
    kubectl -n "$NAMESPACE" get rabbitmqbackup on-demand -o yaml >&2
    kubectl -n "$NAMESPACE" get jobs,pods -l app.kubernetes.io/name=rbak >&2 || true
    die "no completed backup within $TIMEOUT"
fi
kubectl -n "$NAMESPACE" get rabbitmqbackups

if [ "$WITH_RESTORE" = "1" ]; then
    # Like examples/restore-pitr.yaml, but from the backup just made and into a
    # new queue next to the original (no time window: everything).
    log "restoring the on-demand backup into queue orders-restored"
    kubectl -n "$NAMESPACE" apply -f - <<YAML
apiVersion: rbak.io/v1alpha1
kind: RabbitMQRestore
metadata:
  name: kind-restore-$(date +%s)
  labels:
    rbak.io/example: kind
spec:
  backupRef:
    name: on-demand
  queueMapping:
    orders: orders-restored
  engine: job
YAML
    restore=$(kubectl -n "$NAMESPACE" get rabbitmqrestores -l rbak.io/example=kind \
        --sort-by=.metadata.creationTimestamp -o name | tail -n 1)
    if ! kubectl -n "$NAMESPACE" wait "$restore" --for=jsonpath='{.status.phase}'=Succeeded --timeout="$TIMEOUT"; then
        kubectl -n "$NAMESPACE" get "$restore" -o yaml >&2
        die "restore did not succeed"
    fi
    kubectl -n "$NAMESPACE" get rabbitmqrestores
fi

log "done: kubectl -n $NAMESPACE get rabbitmqbackups   (cluster kind-$CLUSTER)"
