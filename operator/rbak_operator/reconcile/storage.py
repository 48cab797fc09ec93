"""What the operator itself reads and deletes in the backup storage: manifests for status,
validation reports, retention and the deletionPolicy. Keys and deletion go through rbak's own
``catalog`` and ``immutable.delete_backup`` (manifest first, Object Lock honoured), one order for
both delete paths."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from rbak.repo.catalog import latest_validation, list_backups, load_manifest
from rbak.errors import RbakError
from rbak.repo.immutable import delete_backup
from rbak.repo.retention import stored_backups
from rbak.storage import open_storage
from rbak.storage.s3 import SHORT, S3Storage
from rbak.repo.validate import unverified_line
from rbak_operator.decide import policy, rbakconfig
from rbak_operator.decide.times import fmt
from rbak_operator.kube.client import Kube
from rbak_operator.kube.credentials import MissingSecret
from rbak_operator.kube.errors import ApiError

log = logging.getLogger("rbak_operator")


def open_backup_storage(kube: Kube, namespace: str, storage: dict[str, Any] | None):
    """The backup storage as the operator can read it, or None (a PVC not mounted here)."""
    s3 = (storage or {}).get("s3")
    if s3:
        # None: boto3 finds its own (IRSA, instance role, environment).
        access_key_id: str | None = None
        secret_access_key: str | None = None
        ref = s3.get("credentialsSecretRef")
        if ref:
            data = kube.secret_values(namespace, ref["name"])
            if data is None:
                raise MissingSecret(f"spec.storage.s3.credentialsSecretRef: Secret {namespace}/{ref['name']} not found")
            ak, sk = ref.get("accessKeyIdKey") or "AWS_ACCESS_KEY_ID", ref.get("secretAccessKeyKey") or "AWS_SECRET_ACCESS_KEY"
            if ak not in data or sk not in data:
                raise MissingSecret(f"Secret {namespace}/{ref['name']} lacks key {ak if ak not in data else sk!r}")
            access_key_id, secret_access_key = data[ak], data[sk]
        # The bucket root: keys (and manifests' segment keys) carry the prefix themselves.
        return S3Storage(bucket=s3["bucket"], prefix="", region=s3.get("region") or "us-east-1",
                         endpoint=s3.get("endpoint"), path_style=bool(s3.get("pathStyle")),
                         access_key_id=access_key_id, secret_access_key=secret_access_key, patience=SHORT)
    pvc = (storage or {}).get("pvc")
    root = os.environ.get("RBAK_OPERATOR_PVC_ROOT")
    if pvc and root:
        path = os.path.join(root, pvc["claimName"], (pvc.get("path") or "backups").strip("/"))
        if os.path.isdir(path):
            return open_storage("file://" + path)
    return None


def load_manifest_safe(kube: Kube, namespace: str, storage_spec: dict[str, Any] | None, backup_id: str, logger):
    try:
        st = open_backup_storage(kube, namespace, storage_spec)
        if st is None:
            return None
        return load_manifest(st, backup_id, rbakconfig.storage_prefix(storage_spec))
    except ApiError:
        raise  # the API's failure retries the pass (ApiError is a RbakError too)
    except RbakError as e:
        logger.warning("cannot read manifest of %s: %s", backup_id, e)
        return None


def report_problems(kube: Kube, body: dict[str, Any], backup_id: str, limit: int = 5) -> str:
    """The problems of the newest validation report stored next to the backup ('' if none).

    spark-operator's ``errorMessage`` only says the driver exited 1 and a
    pod's termination message holds its last lines; the report that
    ``spark/validate.py`` and ``rbak validate --write-report`` store names
    every bad segment key.
    """
    spec = body.get("spec") or {}
    try:
        st = open_backup_storage(kube, body["metadata"]["namespace"], spec.get("storage"))
        if st is None:
            return ""
        found = latest_validation(st, backup_id, rbakconfig.storage_prefix(spec.get("storage")))
        if found is None:
            return ""
        key, report = found
    except ApiError:
        raise  # the API's failure retries the pass (ApiError is a RbakError too)
    except RbakError as e:
        log.warning("cannot read the validation report of %s: %s", backup_id, e)
        return ""
    if report.get("result") == "unverified":  # a deep check that decrypted nothing: the key is the cause

        return f"{unverified_line(str(report.get('unverified')))} (report {key})"
    problems = [str(p) for p in report.get("all_problems") or []]
    if not problems:
        return ""
    more = f" (and {len(problems) - limit} more; report {key})" if len(problems) > limit else f" (report {key})"
    return "; ".join(problems[:limit]) + more


def apply_retention(kube: Kube, body: dict[str, Any], now: datetime, logger) -> list[str]:
    """Delete old complete backups made by this object, per spec.retention (``rbak.repo.retention``: chains kept;
    object-locked ones once their lock has expired). The ids deleted: the caller counts them and posts the
    event, so reading and deleting in the storage has no metrics or events side effect."""
    meta, spec = body["metadata"], body.get("spec") or {}
    try:
        st = open_backup_storage(kube, meta["namespace"], spec.get("storage"))
        if st is None:
            return []
        prefix = rbakconfig.storage_prefix(spec.get("storage"))
        entries = list_backups(st, prefix)
    except ApiError:
        raise  # the API's failure retries the pass (ApiError is a RbakError too)
    except RbakError as e:
        logger.warning("retention: cannot list backups: %s", e)
        return []
    # Every backup in the storage, so the chains of other objects' backups are kept too; only ours are deleted.
    manifests = {e.backup_id: e.manifest for e in entries}
    stored = stored_backups(entries, lambda bid: policy.owned(bid, manifests[bid], meta))
    plan = policy.retention_plan(stored, spec.get("retention"), now)
    ours = {b.backup_id for b in stored if b.owned}
    for v in plan.verdicts:
        if v.backup_id in ours:  # what it keeps and why, and what it deletes
            logger.info("retention: %s %s: %s", "keep" if v.keep else "delete", v.backup_id, "; ".join(v.reasons))
    deleted = []
    for bid in plan.delete:
        try:
            # Manifest first: a half-deleted backup then reads as incomplete, never as complete-but-damaged.
            locked = delete_backup(st, bid, prefix, now)
            if locked is not None:  # S3 Object Lock: kept until its lock expires, deleted by a later pass
                logger.info("retention: %s is object-locked until %s; deleting it later", bid, fmt(locked))
                continue
            deleted.append(bid)
        except RbakError as e:
            logger.warning("retention: cannot delete %s: %s", bid, e)
    return deleted




def delete_owned_backups(kube: Kube, body: Mapping[str, Any], logger) -> tuple[list[str], list[str]] | None:
    """deletionPolicy delete: (deleted, still object-locked) of the backups this object made; raises
    ``RbakError`` when the storage cannot be read, None when it is not reachable from here."""
    meta, spec = body["metadata"], body.get("spec") or {}
    st = open_backup_storage(kube, meta["namespace"], spec.get("storage"))
    if st is None:
        logger.warning("deletionPolicy delete: storage not reachable from the operator; backups kept")
        return None
    prefix = rbakconfig.storage_prefix(spec.get("storage"))
    ids = [e.backup_id for e in list_backups(st, prefix) if policy.owned(e.backup_id, e.manifest, meta)]
    locked = [bid for bid in ids if delete_backup(st, bid, prefix) is not None]  # Object Lock: kept
    return [bid for bid in ids if bid not in locked], locked
