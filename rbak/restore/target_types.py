"""The target queues' types, read once before the first publish (or a dry run's count).

A queue tap (``rbak archive``'s ``archive.taps``) is archived as a stream and restored by default into
the classic or quorum queue it tapped, verified by that queue's depth. Into a stream of that name the
broker confirms every message and the depth check then reads 0 ("dropped ... them"), so a tap whose
target is a stream where it is restored as a queue (or a queue where it is restored as a stream) is refused
before anything is published; classic into quorum and back (a migration) is taken. A dry run reads
the same listing to report a missing target the real run would fail on.
"""

from __future__ import annotations

from ..broker.management import q
from ..errors import ManagementApiError, RbakError, RestoreError
from .options import RestoreOptions
from .plan import QueuePlan
from .queue_restore import missing_target_error


def target_types(plans: list[QueuePlan], options: RestoreOptions) -> dict[tuple[str, str], str] | None:
    """(target vhost, queue) -> type of each queue the target vhosts hold; None when the management API
    cannot list them (each queue's run then finds out on its own)."""
    out: dict[tuple[str, str], str] = {}
    try:
        with options.broker().management() as client:
            for vhost in sorted({p.target_vhost for p in plans}):
                try:  # the restore's management Protocol (the in-memory broker's too): request(), no queues()
                    listing = client.request("GET", f"queues/{q(vhost)}") or []
                except ManagementApiError as e:
                    if e.status == 404:  # a vhost a definitions dry run would create
                        continue
                    raise
                out.update(((vhost, d["name"]), d.get("type") or "classic") for d in listing
                           if isinstance(d, dict) and "name" in d)
    except RbakError:
        return None
    return out


def _kind(queue_type: str) -> str:
    return "a stream" if queue_type == "stream" else f"a {queue_type} queue"


def refuse_mismatched_taps(plans: list[QueuePlan], types: dict[tuple[str, str], str] | None) -> None:
    """Refuse (``RestoreError``) a tap restored as a queue into a stream of that name, or as a stream into a
    queue: the two are published and verified differently."""
    problems = []
    for p in plans:
        actual = (types or {}).get((p.target_vhost, p.target_queue))
        if p.tap_of is None or actual is None or (actual == "stream") == (p.queue_type == "stream"):
            continue  # classic into quorum (a 3.x -> 4.x migration) or back: both are verified by their depth
        queue, recorded = p.tap_of
        # a tap named in restore.queue_mapping is restored as the stream it is archived as, so mapping it onto
        # the stream already there is the shortest way out
        way = (f"declare it as {_kind(p.queue_type)} (x-queue-type: {p.queue_type}) in its place, or restore the tap "
               f"into this stream as the stream it is archived as, with restore.queue_mapping "
               f"('{p.source_vhost}/{p.source_queue}': '{p.target_queue}') in a restore config"
               if p.queue_type != "stream" else
               "declare it as a stream (x-queue-type: stream), or map the tap to another name with "
               "restore.queue_mapping")
        problems.append(f"{p.target_label} is {_kind(actual)}, but tap {p.source_queue!r} of {recorded} queue "
                        f"{queue!r} in vhost {p.source_vhost!r} is restored into it as {_kind(p.queue_type)}: {way}")
    if problems:  # every one at once: fixing them one run at a time is a run per tap
        shown = "; ".join(problems[:MAX_NAMED]) + (f"; and {len(problems) - MAX_NAMED} more" if len(problems) >
                                                   MAX_NAMED else "")
        raise RestoreError(f"nothing was published: {shown}")


MAX_NAMED = 10  # taps named in one refusal


def dry_run_missing(p: QueuePlan, types: dict[tuple[str, str], str] | None, options: RestoreOptions) -> str | None:
    """The error the real run would fail this queue with for a target that does not exist (None: it exists,
    or could not be listed, or the real run creates it: definitions, or publish_mode exchange)."""
    if types is None or options.publish_mode != "queue" or options.restore_definitions or options.definitions_dry_run:
        return None
    return None if (p.target_vhost, p.target_queue) in types else missing_target_error(p)
