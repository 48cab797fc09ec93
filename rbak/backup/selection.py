"""Which queues a backup reads: the source's selection, applied to the management API's listing.

An ``include`` pattern that matches no queue is a configuration error: a nightly job with a typo
would otherwise "succeed" with nothing, every night.
"""

from __future__ import annotations

import logging

from ..base.suggest import closest
from ..config import Config, QueueSelection, queue_selected
from ..errors import ConfigError
from .lease import ARCHIVE_LEASE_QUEUE, LEASE_QUEUE
from .management import ManagementClient, QueueInfo
from .preflight import PROBE_QUEUE_PREFIX

log = logging.getLogger("rbak.backup.engine")  # the run's log lines keep the engine's name (log filters, docs)

Skipped = list[tuple[str, str, str]]
"""(vhost, queue, reason) of each queue the run passes over, noted in the manifest."""


def note_skip(skipped: Skipped, vhost: str, name: str, reason: str) -> None:
    log.warning("skipping queue %r in vhost %r: %s", name, vhost, reason)
    skipped.append((vhost, name, reason))


def rbaks_own(name: str) -> bool:
    """rbak's own queues (the backup and archive leases, the preflight probes): never backed up."""
    return name in (LEASE_QUEUE, ARCHIVE_LEASE_QUEUE) or name.startswith(PROBE_QUEUE_PREFIX)


def warn_unmatched_excludes(field: str, patterns: list[str], queues: list[tuple[str, str]], vhosts: list[str],
                            where: str, names: list[str], logger: logging.Logger = log) -> None:
    """An ``exclude`` pattern (``field``) that matches none of ``queues`` is warned about, with the closest of
    ``names``. Not refused: a nightly exclude of queues that come and go (tmp.*) may match nothing some
    nights, and matching nothing only selects more; but a typo must not pass unseen."""
    for pat in patterns:
        if not any(queue_selected(v, n, None, [pat], [], vhosts, []) for v, n in queues):
            logger.warning("%s: %r matches no queue %s: it excludes nothing%s", field, pat, where, closest(pat, names))


def select_queues(cfg: Config, client: ManagementClient, skipped: Skipped) -> list[QueueInfo]:
    """The queues to read, by vhost and name; exclusive ones are noted in ``skipped``."""
    assert cfg.source is not None  # a backup configuration (BackupEngine checked it)
    sel = cfg.source.queues
    if cfg.backup.definitions_only:
        return []
    if sel.vhosts:
        infos: list[QueueInfo] = []
        for v in sel.vhosts:
            infos.extend(client.queues(v))
    else:
        infos = client.queues()
    out = []
    for q in infos:
        if rbaks_own(q.name):
            continue
        if not sel.matches(q.vhost, q.name, q.queue_type):
            continue
        if q.queue_type == "stream" and not cfg.backup.stream_enabled:
            continue
        if q.queue_type not in ("classic", "quorum", "stream"):
            log.warning("skipping %s/%s: queue type %r is not supported", q.vhost, q.name, q.queue_type)
            continue
        if q.exclusive:  # only its owning connection can read it (405 RESOURCE_LOCKED)
            note_skip(skipped, q.vhost, q.name, "exclusive queue: only its owning connection can read it")
            continue
        out.append(q)
    if sel.include:
        check_include(sel, [(q.vhost, q.name) for q in infos if q.name != LEASE_QUEUE
                            and not q.name.startswith(PROBE_QUEUE_PREFIX)], bool(out),
                      cfg.source.management_url)
    return sorted(out, key=lambda q: (q.vhost, q.name))


def check_include(sel: QueueSelection, queues: list[tuple[str, str]], selected: bool, where: str) -> None:
    """Refuse (exit 2) a ``source.queues.include`` pattern that matches no queue of the source, naming
    the closest names, and an include that selects nothing once types and excludes apply."""
    names = sorted({n for _, n in queues} | {f"{v}/{n}" for v, n in queues})
    scope = f" in vhost(s) {', '.join(map(repr, sel.vhosts))}" if sel.vhosts else ""
    for pat in sel.include:
        if not any(queue_selected(v, n, None, [pat], [], [], []) for v, n in queues):
            raise ConfigError(f"source.queues.include: {pat!r} matches no queue on {where}{scope}"
                              + closest(pat, names) + "; nothing was written (backup.definitions_only: true backs up definitions alone)")
    warn_unmatched_excludes("source.queues.exclude", sel.exclude, queues, [], f"on {where}{scope}", names)
    if not selected:
        raise ConfigError(f"source.queues: include {sel.include} selects no queue on {where}{scope} once "
                          f"types {sel.types} and exclude {sel.exclude} apply; nothing was written")
