"""Leader election on a ``coordination.k8s.io/v1`` Lease: one active operator replica, the others standby.

Why a Lease and not kopf's peering: a Lease is the primitive Kubernetes' own controllers use (client-go's
``leaderelection``), needs no CRD and no cluster-wide object, and lets kopf run standalone, so kopf puts
no finalizer of its own on our objects. The rules follow client-go:

- the holder renews ``spec.renewTime`` every ``retry`` seconds; it gives up (and the process exits) when
  no renewal succeeded for ``renew_deadline`` (two thirds of the lease duration), before a standby may
  take over;
- a standby takes the Lease when its record has not changed for ``leaseDurationSeconds`` as *it* observed
  them (its own monotonic clock, never the holder's timestamps: clock skew between nodes cannot cut a
  lease short);
- every write is a PUT with the resourceVersion read, so two standbys racing for one expired Lease
  cannot both win (the loser gets 409 and waits);
- a clean shutdown releases the Lease (empty holder), so a rolling update hands over at once.

Correctness never depends on this: slots are persisted before Jobs start and each slot maps to one Job name.
``decide`` is the pure part; ``Elector`` does the calls.

Why not the pinned client's ``kubernetes.leaderelection`` (``LeaderElection`` with a ``LeaseLock``, read in
kubernetes 37.0.1): it cannot do three of the rules above, and one more thing the operator needs.

- It never releases the Lease: ``run`` returns after ``onstopped_leading`` with the record still naming
  this replica, so every rolling update waits a full lease duration for the standby to take over.
- It measures the lease on the wall clock (``time.time()`` for ``observed_time_milliseconds`` and the
  renew deadline): a node's clock step shortens or stretches a lease; ``Elector`` uses ``time.monotonic``.
- ``acquire`` loops forever with no stop flag, so a standby that gets SIGTERM cannot stop waiting and
  release nothing; ``Elector.acquire`` and ``hold`` take a ``threading.Event``.
- ``LeaseLock`` calls ``client.CoordinationV1Api()`` on the client's global default configuration and its
  generated models, not the connection the operator loaded (``kube.client.connection``: in-cluster or the
  kubeconfig with exec plugins) nor its plain-JSON calls listed in ``kube.api_calls`` (the RBAC source).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from rbak_operator.kube.client import ApiError, Kube, connection

log = logging.getLogger("rbak_operator.runtime.leader")

CREATE, RENEW, TAKE, WAIT = "create", "renew", "take", "wait"


@dataclass(frozen=True)
class Record:
    """The Lease's spec as far as election reads it."""

    holder: str
    duration: int
    renew_time: str
    transitions: int

    @classmethod
    def of(cls, lease: Mapping[str, Any]) -> Record:
        spec = lease.get("spec") or {}
        return cls(spec.get("holderIdentity") or "", int(spec.get("leaseDurationSeconds") or 0),
                   spec.get("renewTime") or "", int(spec.get("leaseTransitions") or 0))


@dataclass(frozen=True)
class Seen:
    """A record and the local monotonic time it was first observed in that form."""

    record: Record
    at: float


def decide(me: str, current: Record | None, seen: Seen | None, now: float) -> tuple[str, Seen | None]:
    """What to do with the Lease as read now, and what to remember of it."""
    if current is None:
        return CREATE, None
    if current.holder == me:
        return RENEW, Seen(current, now)
    if seen is None or seen.record != current:
        # Released (empty holder) is free at once; anything else starts its own observation clock.
        return (TAKE if not current.holder else WAIT), Seen(current, now)
    if not current.holder or now - seen.at >= current.duration:
        return TAKE, seen
    return WAIT, seen


def micro_time(at: datetime | None = None) -> str:
    """A Kubernetes MicroTime."""
    return (at or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    duration: int = 15

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> LeaseConfig:
        namespace = env.get("RBAK_LEASE_NAMESPACE") or env.get("POD_NAMESPACE") or connection().namespace or "default"
        identity = env.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
        raw = env.get("RBAK_LEASE_SECONDS") or "15"
        try:
            duration = int(raw)
        except ValueError:
            raise ValueError(f"RBAK_LEASE_SECONDS: not a whole number of seconds: {raw!r}") from None
        if duration < 3:
            raise ValueError(f"RBAK_LEASE_SECONDS: {duration} is too short (at least 3)")
        return cls(namespace, env.get("RBAK_LEASE_NAME") or "rbak-operator", identity, duration)


class Elector:
    """Acquire, hold and release one Lease (blocking calls: run ``hold`` on its own thread)."""

    def __init__(self, kube: Kube, cfg: LeaseConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube, self.cfg, self.clock = kube, cfg, clock
        self.retry = max(1.0, cfg.duration / 7)  # ~2 s at 15 s, as client-go's defaults
        self.renew_deadline = cfg.duration * 2 / 3
        self._seen: Seen | None = None
        self.lost = False

    def _body(self, lease: Mapping[str, Any] | None, rec: Record | None, take: bool) -> dict[str, Any]:
        now = micro_time()
        meta: dict[str, Any] = {"name": self.cfg.name, "namespace": self.cfg.namespace}
        spec: dict[str, Any] = {"holderIdentity": self.cfg.identity, "leaseDurationSeconds": self.cfg.duration,
                                "renewTime": now}
        if lease is not None and rec is not None:
            meta["resourceVersion"] = (lease.get("metadata") or {}).get("resourceVersion")
            old = lease.get("spec") or {}
            spec["acquireTime"] = now if take else old.get("acquireTime", now)
            spec["leaseTransitions"] = rec.transitions + (1 if take else 0)
        else:
            spec.update(acquireTime=now, leaseTransitions=0)
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def try_once(self) -> bool:
        """One round: read the Lease and create, renew or take it if due. True when we hold it."""
        lease = self.kube.get_lease(self.cfg.namespace, self.cfg.name)
        rec = Record.of(lease) if lease is not None else None
        action, self._seen = decide(self.cfg.identity, rec, self._seen, self.clock())
        if action == WAIT:
            return False
        if action == CREATE:
            written = self.kube.create_lease(self._body(None, None, take=False))
        else:
            written = self.kube.update_lease(self._body(lease, rec, take=action == TAKE))
        if written is None:  # another replica wrote first: read again next round
            return False
        if action != RENEW:
            log.info("leader: holding Lease %s/%s as %s", self.cfg.namespace, self.cfg.name, self.cfg.identity)
        return True

    def acquire(self, stop: threading.Event) -> bool:
        """Block until we hold the Lease (True) or ``stop`` is set (False)."""
        log.info("leader: waiting for Lease %s/%s as %s", self.cfg.namespace, self.cfg.name, self.cfg.identity)
        while not stop.is_set():
            try:
                if self.try_once():
                    return True
            except ApiError as e:
                log.warning("leader: Lease %s/%s: %s", self.cfg.namespace, self.cfg.name, e)
            stop.wait(self.retry)
        return False

    def hold(self, stop: threading.Event) -> None:
        """Renew until ``stop`` is set; when renewal fails past the deadline or another replica holds the
        Lease, mark ``lost`` and set ``stop`` (the operator then exits, and its pod restarts as a standby)."""
        last_ok = self.clock()
        while not stop.wait(self.retry):
            try:
                if self.try_once():
                    last_ok = self.clock()
                    continue
                holder = self._seen.record.holder if self._seen else ""
                if holder and holder != self.cfg.identity:
                    log.error("leader: Lease %s/%s is now held by %s; stopping",
                              self.cfg.namespace, self.cfg.name, holder)
                    break
            except ApiError as e:
                log.warning("leader: renewing Lease %s/%s: %s", self.cfg.namespace, self.cfg.name, e)
            if self.clock() - last_ok > self.renew_deadline:
                log.error("leader: could not renew Lease %s/%s for %.0f s; stopping",
                          self.cfg.namespace, self.cfg.name, self.renew_deadline)
                break
        else:
            return
        self.lost = True
        stop.set()

    def release(self) -> None:
        """Hand the Lease over at once (clean shutdown): empty holder, if it is still ours."""
        try:
            lease = self.kube.get_lease(self.cfg.namespace, self.cfg.name)
            rec = Record.of(lease) if lease is not None else None
            if rec is None or rec.holder != self.cfg.identity:
                return
            body = self._body(lease, rec, take=False)
            body["spec"].update(holderIdentity=None, leaseDurationSeconds=1)
            if self.kube.update_lease(body) is not None:
                log.info("leader: released Lease %s/%s", self.cfg.namespace, self.cfg.name)
        except ApiError as e:
            log.warning("leader: releasing Lease %s/%s: %s (a standby takes it when it expires)",
                        self.cfg.namespace, self.cfg.name, e)
