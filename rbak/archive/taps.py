"""Queue taps (``archive.taps``): a classic or quorum queue archived continuously through a stream.

For each tapped queue ``Q`` the archiver declares a durable stream ``rbak.tap.Q`` and binds it with
every binding ``Q`` has, so each exchange that routes a message to ``Q`` routes a copy to the tap in
the same routing decision (a publisher's confirm covers both). The tap is then archived as any
stream. It records what was *published to* ``Q`` through exchanges, not what remained in it, and
never what was published straight to ``Q`` through the default exchange, which cannot be bound.

Why bindings and not a shovel (local shovels of RabbitMQ 4.2+ included): a shovel whose source is the
queue consumes and acks, so it takes the messages away from the queue's consumers; one whose source is
an exchange declares a queue of its own bound with one routing key, which is a binding with an extra
hop, a plugin to enable and a second confirm. A binding works the same on every version.

Nothing here touches ``Q`` or its messages, and nothing is deleted but a binding of the tap that ``Q``
no longer has: the tap stream and its bindings stay when the archiver stops, which is what lets it
catch up after it was down (docs/archive.md, "Queue taps", says how to remove a tap).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from ..backup.selection import rbaks_own, warn_unmatched_excludes
from ..base.suggest import closest
from ..broker.management import ManagementClient, QueueInfo
from ..config.sections import QueueSelection, TapsConfig, queue_selected
from ..errors import ConfigError, ManagementApiError
from ..format.manifest import TapOf

log = logging.getLogger(__name__)

TAP_PREFIX = "rbak.tap."  # a name rbak keeps for itself: a queue of another type under it is refused
SYNC_SECS = 1.0  # bindings are compared at each listing, at most this often
POLICY_KEY = {"x-max-age": "max-age", "x-max-length-bytes": "max-length-bytes"}  # a policy's key replaces the
# argument, larger or smaller (tests/engine/test_archive_taps.py, on the three brokers)
Binding = tuple[str, str, str]  # exchange, routing key, arguments (canonical JSON)


@dataclass(frozen=True, slots=True)
class Tap:
    vhost: str
    queue: str
    queue_type: str

    @property
    def stream(self) -> str:
        return TAP_PREFIX + self.queue

    @property
    def of(self) -> TapOf:
        return TapOf(self.queue, self.queue_type)

    @property
    def label(self) -> str:
        return f"tap {self.stream!r} of queue {self.queue!r} in vhost {self.vhost!r}"


def untappable(q: QueueInfo) -> str | None:
    """Why a queue cannot be tapped, or None."""
    if q.queue_type == "stream":
        return "is a stream: streams are archived as they are (select it in source.queues)"
    if q.queue_type not in ("classic", "quorum"):
        return f"is a {q.queue_type} queue; only classic and quorum queues can be tapped"
    if q.exclusive:
        return "is exclusive: it belongs to one connection and goes with it"
    if q.auto_delete:
        return "is auto-delete: it goes with its last consumer"
    if q.name.startswith(TAP_PREFIX):
        return f"is named under {TAP_PREFIX!r} (rbak's names: a tap's name, not a queue to tap)"
    if len((TAP_PREFIX + q.name).encode()) > 255:
        return f"has a name too long for its tap stream {TAP_PREFIX + q.name!r} (255 bytes at most)"
    return None


def passed_over(name: str) -> bool:
    """rbak's own queues (lease, probe, tap streams): a glob passes over them without a word."""
    return rbaks_own(name) or name.startswith(TAP_PREFIX)


def _key(b: dict[str, Any]) -> Binding:
    return b["source"], b.get("routing_key") or "", json.dumps(b.get("arguments") or {}, sort_keys=True)


class Taps:
    """The tapped queues of an archive: checked at start (``prepare``), followed at each listing (``sync``)."""

    def __init__(self, cfg: TapsConfig, source_vhosts: list[str], archive: str):
        self.cfg = cfg
        self.vhosts = list(cfg.vhosts or source_vhosts)  # empty: every vhost
        self.archive = archive
        self.taps: dict[tuple[str, str], Tap] = {}  # (vhost, tap stream) -> tap
        self._said: set[str] = set()  # warnings given once
        self._synced = 0.0
        self._declared = 0  # tap streams declared: a listing taken before one does not show it

    def streams(self) -> set[tuple[str, str]]:
        return set(self.taps)

    def of(self, vhost: str, stream: str) -> TapOf | None:
        t = self.taps.get((vhost, stream))
        return t.of if t is not None else None

    def _once(self, key: str, msg: str, *args: Any) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning("archive %s: " + msg, self.archive, *args)

    def resolve(self, client: ManagementClient, strict: bool, queues: list[QueueInfo] | None = None) -> list[Tap]:
        """The queues ``include`` names, each tappable. ``strict`` (at start): a vhost, pattern or queue that
        does not fit is refused (``ConfigError`` naming the field and the queue); later it is warned about once
        and left out (a queue deleted while the archive runs keeps its tap stream, which is archived as it is).
        ``queues``: a listing taken already, of these vhosts or more (``list_queues``); else they are listed."""
        cfg = self.cfg
        if strict:
            known = client.vhosts()
            missing = [v for v in self.vhosts if v not in known]
            if missing:
                raise ConfigError(f"archive.taps.vhosts: vhost {', '.join(map(repr, missing))} does not exist on "
                                  f"{client.base}")
        if queues is not None:  # in the order listing them one vhost after another gives
            infos = [i for v in self.vhosts for i in queues if i.vhost == v] if self.vhosts else list(queues)
        else:
            infos = [i for v in self.vhosts for i in client.queues(v)] if self.vhosts else client.queues()
        out: dict[tuple[str, str], Tap] = {}
        where = f"in vhost(s) {', '.join(map(repr, self.vhosts))}" if self.vhosts else "in any vhost"
        if strict:  # not refused, as source.queues.exclude: it only taps more
            warn_unmatched_excludes("archive.taps.exclude", cfg.exclude, [(q.vhost, q.name) for q in infos],
                                    self.vhosts, where, [q.name for q in infos if not passed_over(q.name)], log)
        for pat in cfg.include:
            exact = not any(c in pat for c in "*?[")
            hits = [q for q in infos if queue_selected(q.vhost, q.name, None, [pat], cfg.exclude, self.vhosts, [])
                    and (exact or not passed_over(q.name))]  # a glob passes over rbak's own queues silently
            found = 0
            for q in hits:
                problem = untappable(q)
                if problem is None:
                    out[(q.vhost, q.name)] = Tap(q.vhost, q.name, q.queue_type)
                    found += 1
                elif exact or q.queue_type != "stream":  # a glob's streams (taps included) are not queues to tap
                    msg = f"archive.taps.include: {pat!r}: queue {q.name!r} in vhost {q.vhost!r} {problem}"
                    if strict and exact:  # a glob's transient queue (an app's exclusive reply queue) is skipped
                        raise ConfigError(msg + "; nothing was archived")
                    self._once(msg, "%s; not tapped", msg)
            if not found:
                # a queue the pattern names but ``exclude`` takes out is named as such, not as missing
                excluded = [f"queue {q.name!r} in vhost {q.vhost!r}" for q in infos if not hits
                            and (exact or untappable(q) is None)
                            and queue_selected(q.vhost, q.name, None, [pat], [], self.vhosts, [])]
                streams = [q.name for q in hits if q.queue_type == "stream"]
                msg = (f"archive.taps.include: {pat!r}: {', '.join(excluded[:5])} excluded by archive.taps.exclude "
                       f"{cfg.exclude!r}" if excluded else
                       f"archive.taps.include: {pat!r} names no queue {where}"
                       + closest(pat, [q.name for q in infos if not passed_over(q.name)]) if exact and not hits else
                       f"archive.taps.include: {pat!r} matches no classic or quorum queue to tap {where}"
                       + (f" (it matches the stream(s) {', '.join(map(repr, streams[:5]))}: streams are archived "
                          "through source.queues)" if streams else ""))
                vh = pat.split("/", 1)[0] if "/" in pat else None
                if vh is not None and self.vhosts and vh not in self.vhosts:  # a "vhost/queue" pattern looked nowhere
                    msg += f" (it names vhost {vh!r}, which is not among them: add it to archive.taps.vhosts)"
                if strict:
                    raise ConfigError(msg + "; nothing was archived")
                self._once(msg, "%s (now)", msg)
        return [out[k] for k in sorted(out)]

    def prepare(self, client: ManagementClient, taps: list[Tap]) -> None:
        """At start, with ``resolve(strict=True)``'s taps: every tap checked (nothing is declared until all are),
        its stream declared and its bindings made as its queue's."""
        for t in taps:
            self._existing(client, t)
        self._add(client, taps)
        self.sync(client, force=True)

    def _add(self, client: ManagementClient, taps: list[Tap]) -> None:
        for t in taps:
            if (t.vhost, t.stream) in self.taps:
                continue
            self._declare(client, t)
            self.taps[(t.vhost, t.stream)] = t
            log.warning("archive %s: %s records what exchanges route to the queue; messages published straight "
                        "to it through the default exchange (routing key %r) are NOT recorded", self.archive,
                        t.label, t.queue)

    def _declare(self, client: ManagementClient, t: Tap) -> None:
        args = {"x-queue-type": "stream", "x-max-age": self.cfg.max_age,
                "x-max-length-bytes": self.cfg.max_length_bytes}
        found = self._existing(client, t)
        if found is None:
            client.declare_queue(t.vhost, t.stream, args)
            self._declared += 1
            log.info("archive %s: declared %s (max-age %s, max-length-bytes %d)", self.archive, t.label,
                     self.cfg.max_age, self.cfg.max_length_bytes)
        else:
            fields = {"x-max-age": ("max_age", self.cfg.max_age), "x-max-length-bytes": ("max_length_bytes",
                                                                                       self.cfg.max_length_bytes)}
            for arg, (field, want) in fields.items():
                if found.arguments.get(arg) != want:
                    self._once(f"{t.stream} {arg}", "archive.taps.%s %s is not applied to the existing %s: it keeps "
                               "%s %s (a stream's arguments are fixed at declaration; change it with a policy whose %s "
                               "replaces it, or delete the tap stream to declare it again, which loses what it "
                               "holds)", field, want, t.label, arg, found.arguments.get(arg), POLICY_KEY[arg])

    @staticmethod
    def _existing(client: ManagementClient, t: Tap) -> QueueInfo | None:
        """The tap stream if it exists; a queue of another type under its name is refused."""
        found = client.queue(t.vhost, t.stream)
        if found is not None and found.queue_type != "stream":
            raise ConfigError(f"archive.taps.include: queue {t.queue!r} in vhost {t.vhost!r}: its tap stream's "
                              f"name {t.stream!r} is taken by a {found.queue_type} queue (names under "
                              f"{TAP_PREFIX!r} are rbak's); nothing was archived")
        return found

    @staticmethod
    def _queue_bindings(client: ManagementClient, t: Tap) -> list[dict[str, Any]] | None:
        """The tapped queue's bindings, None when it is gone. Its existence is asked first: the bindings of a
        deleted queue are an empty list on 3.10.8 and 4.3.6, not a 404, and would unbind the tap."""
        if client.queue(t.vhost, t.queue) is None:
            return None
        try:
            return client.queue_bindings(t.vhost, t.queue)
        except ManagementApiError as e:
            if e.status != 404:
                raise
            return None

    def sync(self, client: ManagementClient, force: bool = False, queues: list[QueueInfo] | None = None) -> bool:
        """New queues the patterns match get a tap; each tap gets the bindings its queue has now and loses
        those it no longer has (both logged). A queue that is gone keeps its tap stream, said once.
        ``queues``: this pass's listing (``list_queues``), so the queues are listed once per pass. True when
        a tap was added or its stream declared: ``queues`` does not show that, the caller lists again."""
        now = time.monotonic()
        if not force and now - self._synced < SYNC_SECS:
            return False
        self._synced = now
        before = (len(self.taps), self._declared)
        if not force:
            self._add(client, self.resolve(client, strict=False, queues=queues))
        for t in self.taps.values():
            of_queue = self._queue_bindings(client, t)
            if of_queue is None:
                self._once(f"gone {t.vhost}/{t.queue}", "%s: the queue is gone; its tap stream stays, with the "
                           "bindings it had", t.label)
                continue
            want = {_key(b): b for b in of_queue if b["source"]}
            if not want:  # a queue only ever published to straight (the default exchange): a tap that stays empty
                self._once(f"unbound {t.vhost}/{t.queue}", "%s: the queue is bound to no exchange but the default "
                           "one, so the tap records nothing until it is (what is published straight to the queue is "
                           "not recorded)", t.label)
            try:
                have = {_key(b): b for b in client.queue_bindings(t.vhost, t.stream) if b["source"]}
            except ManagementApiError as e:  # deleted under a running archiver that still has it in archive.taps
                if e.status != 404:
                    raise
                log.warning("archive %s: %s was deleted while archive.taps names its queue; declaring it again (a "
                            "new epoch of the stream)", self.archive, t.label)
                self._declare(client, t)
                have = {}
            for k in sorted(want.keys() - have.keys()):
                b = want[k]
                try:
                    client.bind_queue(t.vhost, b["source"], t.stream, k[1], b.get("arguments") or {})
                except ManagementApiError as e:  # the exchange deleted since the listing: the next sync sees it
                    log.warning("archive %s: %s: binding from exchange %r not made: %s", self.archive, t.label,
                                b["source"], e)
                    continue
                log.info("archive %s: %s: bound to exchange %r with routing key %r%s, as the queue is", self.archive,
                         t.label, b["source"], k[1], f" and arguments {k[2]}" if k[2] != "{}" else "")
            for k in sorted(have.keys() - want.keys()):
                client.unbind_queue(t.vhost, k[0], t.stream, have[k]["properties_key"])
                log.info("archive %s: %s: unbound from exchange %r with routing key %r, as the queue no longer is "
                         "bound so", self.archive, t.label, k[0], k[1])
        return (len(self.taps), self._declared) != before


def leftover_taps(archive: str, selected: list[QueueInfo], queues: list[QueueInfo],
                  taps: Taps | None) -> dict[tuple[str, str], TapOf]:
    """At start, each tap stream ``rbak.tap.X`` that ``source.queues`` selects while ``archive.taps`` does not
    tap X (taken out of it, or no taps at all), said once: archived as the tap it is (restored into X) when X
    is a classic or quorum queue, else as a plain stream. Nothing binds it any more."""
    types = {(q.vhost, q.name): q.queue_type for q in queues}
    out: dict[tuple[str, str], TapOf] = {}
    for s in selected:
        if not s.name.startswith(TAP_PREFIX) or (taps is not None and taps.of(s.vhost, s.name) is not None):
            continue
        queue = s.name[len(TAP_PREFIX):]
        qt = types.get((s.vhost, queue))
        if qt in ("classic", "quorum"):
            out[(s.vhost, s.name)] = TapOf(queue, qt)
            log.warning("archive %s: stream %r in vhost %r is the tap stream of %s queue %r, which archive.taps "
                        "does not tap: archived through source.queues as its tap (restored into %r), its bindings "
                        "no longer kept in step with the queue's; add %r to archive.taps.include, or exclude %r in "
                        "source.queues.exclude", archive, s.name, s.vhost, qt, queue, queue, queue, s.name)
        else:
            log.warning("archive %s: stream %r in vhost %r is named as a tap stream but archive.taps does not tap "
                        "queue %r (%s): archived through source.queues as a plain stream; exclude %r in "
                        "source.queues.exclude to leave it out", archive, s.name, s.vhost, queue,
                        "no such queue" if qt is None else f"a {qt} queue", s.name)
    return out


def list_queues(client: ManagementClient, sel: QueueSelection, taps: Taps | None) -> list[QueueInfo]:
    """The queues of the vhosts an archive looks at (``source.queues``' and ``archive.taps``'; empty: every
    vhost): one listing serves both ``Taps.sync`` and ``select_streams`` in a pass."""
    vhosts = sel.vhosts
    if taps is not None:
        vhosts = sorted(set(sel.vhosts) | set(taps.vhosts)) if sel.vhosts and taps.vhosts else []
    return [i for v in vhosts for i in client.queues(v)] if vhosts else client.queues()


def select_streams(client: ManagementClient, sel: QueueSelection, taps: Taps | None,
                   queues: list[QueueInfo] | None = None) -> list[QueueInfo]:
    """The streams an archive follows: those ``source.queues`` selects, and the tap streams. ``queues``: a
    listing taken already (``list_queues``); else the queues are listed."""
    infos = list_queues(client, sel, taps) if queues is None else queues
    tapped = taps.streams() if taps is not None else set()
    return sorted((q for q in infos if q.queue_type == "stream"
                   and (sel.matches(q.vhost, q.name, "stream") or (q.vhost, q.name) in tapped)),
                  key=lambda q: (q.vhost, q.name))


def check_selection(client: ManagementClient, sel: QueueSelection, taps: list[Tap] | None, where: str) -> None:
    """At start, before any tap stream is declared: each ``source.queues.include`` pattern names a stream (or a tap
    about to be declared), as ``rbak backup`` refuses a pattern that matches no queue, and the selection is not
    empty. With taps, an ``include`` of its own that selects nothing is a typo, not "the taps alone"."""
    infos = [i for v in sel.vhosts for i in client.queues(v)] if sel.vhosts else client.queues()
    streams = [(q.vhost, q.name) for q in infos if q.queue_type == "stream"] + [(t.vhost, t.stream) for t in taps or []]
    scope = f" in vhost(s) {', '.join(map(repr, sel.vhosts))}" if sel.vhosts else ""
    for pat in sel.include:
        if not any(queue_selected(v, n, None, [pat], [], sel.vhosts, []) for v, n in streams):
            other = [f"{q.name!r} is a {q.queue_type} queue" for q in infos
                     if queue_selected(q.vhost, q.name, None, [pat], [], sel.vhosts, [])]
            why = (f" ({', '.join(other[:3])}: archive it through archive.taps)" if other else
                   closest(pat, [n for _, n in streams]))
            raise ConfigError(f"source.queues.include: {pat!r} matches no stream on {where}{scope}{why}; nothing "
                              "was archived")
    if (taps is None or sel.include) and not any(sel.matches(v, n, "stream") for v, n in streams):
        raise ConfigError(
            f"source.queues: {'include ' + repr(sel.include) + ' ' if sel.include else ''}selects no stream on "
            f"{where}{scope}; rbak archive follows streams only (a classic or quorum queue is archived through "
            "archive.taps" + ("; to archive only the taps, include 'rbak.tap.*')"
                              if taps is not None else ")"))
