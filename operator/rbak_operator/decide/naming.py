"""Deterministic names: a slot always maps to the same Job and backup id.

That is what makes a restart (or a second replica) harmless: creating the
Job for a slot that already has one fails with 409 instead of running twice.
Names are DNS-1123 labels of at most 63 characters (a Job's name becomes a
pod label); a name too long keeps a readable head and gains a hash tail.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timezone

MAX_LABEL = 63
_BAD = re.compile(r"[^a-z0-9-]+")


def dns_label(text: str, max_len: int = MAX_LABEL) -> str:
    """A valid DNS-1123 label for ``text``; distinct inputs stay distinct."""
    clean = _BAD.sub("-", text.lower()).strip("-")
    clean = re.sub(r"-{2,}", "-", clean) or "x"
    if clean == text and len(clean) <= max_len:
        return clean
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    if len(clean) <= max_len and clean != text:
        # Changed by cleaning: keep distinct from the raw name that cleans the same.
        head = clean[: max_len - 11].rstrip("-")
        return f"{head}-{digest}"
    head = clean[: max_len - 11].rstrip("-")
    return f"{head}-{digest}"


def slot_stamp(slot: datetime) -> str:
    return slot.astimezone(timezone.utc).strftime("%Y%m%d-%H%M")


def scheduled_run_name(backup_name: str, slot: datetime) -> str:
    """Job name == ConfigMap name == backup id for a scheduled slot."""
    stamp = slot_stamp(slot)
    base = f"{backup_name}-{stamp}"
    if len(base) <= MAX_LABEL and dns_label(base) == base:
        return base
    digest = hashlib.sha256(backup_name.encode()).hexdigest()[:8]
    head = _BAD.sub("-", backup_name.lower()).strip("-")[: MAX_LABEL - len(stamp) - 10].rstrip("-")
    return f"{head}-{digest}-{stamp}"


def manual_run_name(backup_name: str, trigger_value: str) -> str:
    """Job name for an on-demand run; the annotation value picks the run."""
    digest = hashlib.sha256(trigger_value.encode()).hexdigest()[:8]
    suffix = f"manual-{digest}"
    head = _BAD.sub("-", backup_name.lower()).strip("-")[: MAX_LABEL - len(suffix) - 1].rstrip("-")
    return f"{head}-{suffix}"


def owner_tag(namespace: str, uid: str | None) -> str:
    """Six hex digits standing for one object (its namespace and uid): what keeps the backup ids of
    same-named objects in two namespaces, or of an object deleted and made again, apart."""
    return hashlib.sha256(f"{namespace}/{uid or ''}".encode()).hexdigest()[:6]


def run_backup_id(run_name: str, namespace: str, uid: str | None) -> str:
    """The backup id of a run: its Job name (unique in the namespace) and the object's ``owner_tag``
    (unique across the namespaces and objects that share one storage)."""
    return f"{run_name}-{owner_tag(namespace, uid)}"


def restore_run_name(restore_name: str) -> str:
    return dns_label(f"{restore_name}-restore")


def validate_run_name(run_name: str) -> str:
    return dns_label(f"{run_name}-validate")


def label_value(text: str) -> str:
    """A label value (<= 63 chars) standing for ``text``."""
    return dns_label(text)


def owns(backup_name: str, run_name: str) -> bool:
    """Whether ``run_name`` (a Job name / backup id) has the shape of this RabbitMQBackup's ids: only
    for backups whose manifest records no owner (made before owners were recorded, ``policy.owned``).

    Exact shapes only, so retention and deletion never touch another object's
    backups (``nightly`` does not own ``nightlyx-...`` nor hand-made ids).
    """
    sample = datetime(2000, 1, 1, tzinfo=timezone.utc)
    sched_prefix = scheduled_run_name(backup_name, sample)[: -len(slot_stamp(sample))]
    manual_prefix = manual_run_name(backup_name, "")[:-8]
    return bool(re.fullmatch(re.escape(sched_prefix) + r"\d{8}-\d{4}", run_name)
                or re.fullmatch(re.escape(manual_prefix) + r"[0-9a-f]{8}", run_name))
