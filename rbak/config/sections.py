"""The sections of the configuration model (``Config`` in ``model`` holds one of each).

Each field carries its documentation in its dataclass metadata (``doc_field``), which ``reference`` turns
into the configuration reference and the JSON schema.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Optional, Sequence, Union
from urllib.parse import SplitResult, quote, unquote, urlsplit, urlunsplit

from ..storage import open_storage
from .fields import _Section, doc_field, mask_url
from .validation import parse_time_bound

if TYPE_CHECKING:
    from ..sealing.envelope import KeySources, KmsSettings
    from ..storage.base import Storage

SCRATCH_VHOST_PREFIX = "rbak-drill"


# --------------------------------------------------------------------------
# Sections.
# --------------------------------------------------------------------------

QueueType = Literal["classic", "quorum", "stream"]


@dataclass(repr=False)
class TlsConfig(_Section):
    """TLS for AMQP (``amqps://``) and the management API (``https://``)."""

    enabled: bool = doc_field(False, "Use TLS. Also implied by an `amqps://` / `https://` URL; never falls back to plaintext.")
    ca_cert: Optional[str] = doc_field(None, "PEM file of the CA(s) that signed the broker's certificate; the system store when unset.")
    client_cert: Optional[str] = doc_field(None, "PEM client certificate for mutual TLS (with `client_key`).")
    client_key: Optional[str] = doc_field(None, "PEM private key of `client_cert`.")
    verify: bool = doc_field(True, "Verify the broker's certificate and host name. `false` is insecure and logged as a warning.")
    server_name: Optional[str] = doc_field(None, "Host name to verify the certificate against (SNI), when it differs from the URL's host.")


@dataclass(repr=False)
class QueueSelection(_Section):
    """Which queues a run covers. Patterns are shell globs (`*`, `?`, `[abc]`) matched
    against the queue name, or `vhost/queue` when the pattern contains a `/`;
    a pattern without glob characters is an exact name."""

    include: list[str] = doc_field(doc="Queues to cover (globs or exact names). Empty: every queue.", factory=list)
    exclude: list[str] = doc_field(doc="Queues to skip (globs or exact names); wins over `include`.", factory=list)
    vhosts: list[str] = doc_field(doc="Vhosts to cover (exact names, `/` is the default vhost). Empty: every vhost.", factory=list)
    types: list[QueueType] = doc_field(doc="Queue types to cover: `classic`, `quorum`, `stream`.",
                                       factory=lambda: ["classic", "quorum", "stream"])
    min_messages: int = doc_field(0, "Skip queues holding fewer messages than this (streams are never skipped by it). "
                                  "A backup counts exactly, by a passive declare just before the read (the management "
                                  "API's figure can be seconds old), and lists each queue it skips in the manifest's "
                                  "`queue_status`; a restore goes by the backup's count.", min=0)

    def matches(self, vhost: str, name: str, queue_type: str | None = None, messages: int | None = None) -> bool:
        """Whether a queue is covered by this selection; ``messages``: its exact count, when known."""
        if messages is not None and self.too_few(queue_type, messages):
            return False
        return queue_selected(vhost, name, queue_type, self.include, self.exclude, self.vhosts, self.types)

    def too_few(self, queue_type: str | None, messages: int) -> bool:
        """Whether ``min_messages`` skips a queue holding ``messages`` (never a stream)."""
        return queue_type != "stream" and messages < self.min_messages


def queue_selected(vhost: str, name: str, queue_type: str | None, include: Sequence[str],
                   exclude: Sequence[str], vhosts: Sequence[str], types: Sequence[str]) -> bool:
    """The one rule for queue selection (backup's ``source.queues``, restore's selection).

    A pattern with ``/`` matches ``vhost/queue``, otherwise the queue name; a pattern
    without ``* ? [`` matches exactly. Empty ``include``/``vhosts``/``types`` cover all.
    """
    if vhosts and vhost not in vhosts:
        return False
    if queue_type is not None and types and queue_type not in types:
        return False

    def hit(pattern: str) -> bool:
        subject = f"{vhost}/{name}" if "/" in pattern else name
        if not any(c in pattern for c in "*?["):
            return subject == pattern
        return fnmatch.fnmatchcase(subject, pattern)

    if include and not any(hit(p) for p in include):
        return False
    return not any(hit(p) for p in exclude)


@dataclass(repr=False)
class ConnectionConfig(_Section):
    """A broker: `source` for backups, `target` for restores."""

    amqp_url: str = doc_field(None, "AMQP URL, e.g. `amqp://user:pass@host:5672/%2f` (`%2f` is the vhost `/`); without `user:pass@` the management credentials are used. "
                              "`amqps://` for TLS. Under `target`, a vhost in the URL is where a single-vhost backup "
                              "is restored (`amqp://host:5672` without one: the backup's own vhosts); see "
                              "docs/restore.md, \"Where a restore goes\".", required=True)
    management_url: str = doc_field("http://localhost:15672", "Management API base URL (`https://` for TLS).")
    management_username: Optional[str] = doc_field(None, "Management API user; defaults to the AMQP URL's user.")
    management_password: Optional[str] = doc_field(None, "Management API password; defaults to the AMQP URL's password.", secret=True)
    stream_port: int = doc_field(5552, "RabbitMQ stream protocol port. A backup asks each stream's last offset there "
                                 "(with `tls`) and stops reading at it, and a restore asks where a target stream ends "
                                 "(3.11+); when it cannot, the read ends after a quiet second.",
                                 min=1, max=65535)
    tls: TlsConfig = doc_field(doc="TLS settings.", factory=TlsConfig)
    queues: QueueSelection = doc_field(doc="Queue selection of a backup (`source.queues`). Under `target` and "
                                       "`drill.target` it is not used and must stay unset: a restore selects with "
                                       "`restore.queues`, a drill covers every queue of the backup.",
                                       factory=QueueSelection)
    heartbeat_secs: int = doc_field(60, "AMQP heartbeat interval in seconds (0 disables).", min=0)
    connection_timeout_secs: float = doc_field(10.0, "Socket connect / management request timeout in seconds.", min=0.1)

    # -- derived values -------------------------------------------------------
    def _url(self) -> SplitResult:
        return urlsplit(self.amqp_url)

    # An amqp_url without credentials takes them from management_username/password:
    # a secret then never has to be URL-encoded into the URL (the operator relies on it).
    @property
    def username(self) -> str:
        p = self._url()
        if p.username is not None:
            return unquote(p.username)
        return self.management_username if self.management_username is not None else "guest"

    @property
    def password(self) -> str:
        p = self._url()
        if p.password is not None:
            return unquote(p.password)
        if p.username is None and self.management_password is not None:
            return self.management_password
        return "guest"

    @property
    def mgmt_username(self) -> str:
        return self.management_username if self.management_username is not None else self.username

    @property
    def mgmt_password(self) -> str:
        return self.management_password if self.management_password is not None else self.password

    @property
    def use_tls(self) -> bool:
        return bool(self.tls.enabled) or self._url().scheme == "amqps"

    @property
    def host(self) -> str:
        return self._url().hostname or "localhost"

    @property
    def port(self) -> int:
        return self._url().port or (5671 if self.use_tls else 5672)

    def amqp_url_for_vhost(self, vhost: str) -> str:
        """The AMQP URL with its vhost replaced (vhost percent-encoded, `/` as `%2f`)."""
        p = self._url()
        scheme = p.scheme
        if self.tls.enabled and scheme == "amqp":
            scheme = "amqps"
        return urlunsplit((scheme, p.netloc, "/" + quote(vhost, safe=""), p.query, ""))

    @property
    def url_vhost(self) -> str:
        """The vhost named in ``amqp_url`` (``/`` when it names none)."""
        path = self._url().path
        return unquote(path[1:]) if len(path) > 1 else "/"

    @property
    def named_vhost(self) -> str | None:
        """The vhost ``amqp_url`` names, or None when its path is empty or ``/`` (names none)."""
        path = self._url().path
        return unquote(path[1:]) if len(path) > 1 else None

    @property
    def safe_amqp_url(self) -> str:
        return mask_url(self.amqp_url) or ""


@dataclass(repr=False)
class StorageConfig(_Section):
    """Where backups live. `prefix` is applied inside the storage root:
    keys are `{prefix}/{backup_id}/...`."""

    backend: Literal["filesystem", "s3", "azure", "gcs", "memory"] = doc_field(
        None, "Storage backend: `filesystem`, `s3`, `memory` (`azure`, `gcs` are recognised but not supported yet).", required=True)
    path: Optional[str] = doc_field(None, "Directory for `filesystem` (required there); the store name for `memory`.")
    bucket: Optional[str] = doc_field(None, "Bucket for `s3` (required there).")
    region: Optional[str] = doc_field(None, "S3 region.")
    prefix: Optional[str] = doc_field(None, "Key prefix inside the bucket/directory.")
    endpoint: Optional[str] = doc_field(None, "S3-compatible endpoint URL (MinIO, Ceph, moto).")
    path_style: bool = doc_field(False, "Path-style S3 addressing (needed by most S3-compatible servers).")
    access_key_id: Optional[str] = doc_field(None, "S3 access key; boto3's credential chain (env, profile, IRSA) when unset.")
    secret_access_key: Optional[str] = doc_field(None, "S3 secret key (with `access_key_id`).", secret=True)
    sse: Optional[Literal["AES256", "aws:kms"]] = doc_field(
        None, "S3 server-side encryption of every object put: `AES256` (SSE-S3) or `aws:kms` (SSE-KMS).")
    sse_kms_key_id: Optional[str] = doc_field(None, "KMS key id/ARN for `sse: aws:kms` (the bucket's default KMS key when unset).")
    object_lock_mode: Optional[Literal["GOVERNANCE", "COMPLIANCE"]] = doc_field(
        None, "S3 Object Lock (the bucket must have it enabled): every object is written once, locked in this mode; "
        "the manifest and state are written once at the end, and deletion waits for locks to expire.")
    object_lock_retain_days: Optional[float] = doc_field(None, "How long each object stays locked (days; required "
                                                         "with `object_lock_mode`).", min=0)

    def storage_url(self) -> str:
        """The rbak storage URL of this backend's root (without `prefix`, which the key layout applies)."""
        b = self.backend
        if b == "filesystem":
            return "file://" + os.path.abspath(os.path.expanduser(self.path or "."))
        if b == "memory":
            return f"memory://{self.path or ''}"
        if b == "s3":
            q = []
            if self.region:
                q.append("region=" + quote(self.region, safe=""))
            if self.endpoint:
                q.append("endpoint=" + quote(self.endpoint, safe=":/"))
            if self.path_style:
                q.append("path_style=true")
            if self.sse:
                q.append("sse=" + quote(self.sse, safe=""))
            if self.sse_kms_key_id:
                q.append("sse_kms_key_id=" + quote(self.sse_kms_key_id, safe=""))
            if self.object_lock_mode:
                q.append(f"object_lock_mode={self.object_lock_mode}&object_lock_retain_days={self.object_lock_retain_days}")
            return f"s3://{self.bucket}" + ("?" + "&".join(q) if q else "")
        return f"{b}://{self.bucket or ''}"

    def open(self) -> Storage:
        """An rbak ``Storage`` for this backend (``rbak.storage``)."""
        if self.backend == "s3" and (self.access_key_id or self.secret_access_key):
            from ..storage.s3 import S3Storage  # noqa: PLC0415 - boto3 takes ~1 s to import

            return S3Storage(
                bucket=self.bucket or "", region=self.region, endpoint=self.endpoint, path_style=self.path_style,
                access_key_id=self.access_key_id, secret_access_key=self.secret_access_key,
                sse=self.sse, sse_kms_key_id=self.sse_kms_key_id, object_lock_mode=self.object_lock_mode,
                object_lock_retain_days=self.object_lock_retain_days, url=self.storage_url(),
            )

        return open_storage(self.storage_url())


@dataclass(repr=False)
class BackupOptions(_Section):
    """How a backup reads queues and writes segments."""

    compression: Literal["zstd", "lz4", "none"] = doc_field("zstd", "Segment and definitions compression: `zstd`, `lz4`, `none`.")
    compression_level: int = doc_field(3, "zstd level, 1-22 (ignored for lz4/none).", min=1, max=22)
    stream_enabled: bool = doc_field(True, "Back up stream queues (read by offset, never consumed).")
    stream_incremental: bool = doc_field(True, "Start each stream after the last offset a previous backup stored "
                                         "(kept in `offset_storage`); `false` reads every stream from its first offset.")
    segment_max_bytes: int = doc_field(128 * 1024 * 1024, "Rotate a segment once its uncompressed payload reaches this many bytes "
                                       "(also bounds memory per queue).", min=1024)
    segment_max_interval_ms: int = doc_field(60_000, "Rotate a segment once it has been open this long.", min=1)
    max_concurrent_queues: int = doc_field(4, "Queues read at the same time (a bounded pool).", min=1, max=256)
    reader_processes: bool = doc_field(False, "With `max_concurrent_queues` above 1, read classic queues of 1,000 messages or "
                                       "more in worker processes (forked from one forkserver, reused across queues); the "
                                       "checkpoint, manifest and progress stay in the main process. Off by default: since reads "
                                       "parse deliveries without pika's decoding, threads use the cores better (8 x 50,000: "
                                       "1.44-1.46x one worker with threads, 1.06-1.12x with processes). Quorum queues, streams "
                                       "and small queues are always read by threads.")
    max_connections: Optional[int] = doc_field(None, "Not used, and never was: each worker opens its own AMQP connection per vhost "
                                                 "(so at most `max_concurrent_queues` per vhost). Accepted so configurations "
                                                 "that set it still load; a backup that sets it logs a warning.", min=1, max=64)
    prefetch_count: int = doc_field(1000, "Prefetch for stream reads (classic/quorum reads use the broker's own limits).", min=1, max=65535)
    include_definitions: bool = doc_field(True, "Export `/api/definitions` into `definitions/definitions.json<ext>`.")
    definitions_only: bool = doc_field(False, "Back up the definitions and no queue: the backup is listed as "
                                       "`definitions-only` and counts for retention. Without it, a `source.queues.include` "
                                       "pattern that matches no queue is refused (exit 2), and a backup that found no "
                                       "message is listed as `empty`: `rbak restore` without an id and `rbak prune`'s keep "
                                       "rules pass over it. `source.queues` must stay unset.")
    checkpoint_interval_secs: float = doc_field(5.0, "How often progress is written to the local checkpoint database.", min=0)
    read_timeout_secs: float = doc_field(30.0, "Give up on a queue when no message arrives for this long although the queue "
                                         "still reports more (every message is returned to it).", min=0.1)
    max_duration_secs: Optional[float] = doc_field(None, "Abort a queue's read (returning every message) after this long; default: "
                                                   "the broker's `consumer_timeout` minus a margin when known.", min=1)
    delivery_limit_margin: int = doc_field(1, "Deliveries of a quorum message's delivery limit that backups never use: a "
                                           "backup never leaves a message at `x-delivery-count` of the limit minus this "
                                           "or more (every return counts before RabbitMQ 4.3; 4.3+ returns by "
                                           "`basic.nack`, which costs nothing), and refuses the queue instead.", min=1)
    skip_queues_with_consumers: bool = doc_field(False, "Leave out classic and quorum queues that have consumers "
                                                 "when the backup reaches them (noted in the manifest's "
                                                 "`queue_status`, status `skipped`); by default they are read, and their consumers "
                                                 "receive nothing while the backup holds the messages.")
    overwrite: bool = doc_field(False, "Allow reusing the id of a COMPLETED backup (its files are deleted first). Off by default.")
    lease: bool = doc_field(True, "Hold a lease on every vhost the backup reads, from before anything is written until the "
                            "manifest is: the exclusive queue `rbak.lease` (reserved, never backed up), declared on a "
                            "connection named after the backup, so a second backup of the same vhost waits or is refused "
                            "naming the holder (exit code 4), across processes and pods; it ends with the connection, so a "
                            "crashed backup frees it. Needs configure permission on `rbak.lease`; `false` runs without: "
                            "overlapping backups then miss what the other holds (a read cut short is recorded as partial, "
                            "but messages the other already held when a read started are not in its expected count).")
    lease_wait_secs: float = doc_field(0.0, "How long a backup waits for another backup's lease on the same vhost before it "
                                       "gives up (0: refuse at once).", min=0)
    owner: Optional[OwnerConfig] = doc_field(None, "Who the backup belongs to, recorded in its manifest with its source "
                                             "(cluster, vhosts): a run of another owner or source never resumes, "
                                             "completes or replaces it.")


@dataclass(repr=False)
class OwnerConfig(_Section):
    """The object a backup belongs to (the operator sets its RabbitMQBackup), recorded in the manifest's `origin`."""

    namespace: str = doc_field(None, "Namespace of the object.", required=True)
    name: str = doc_field(None, "Name of the object.", required=True)
    uid: Optional[str] = doc_field(None, "Its uid: an object deleted and created again under the same name is another owner.")


@dataclass(repr=False)
class DefinitionsSelection(_Section):
    """Subset of the definitions to import (empty lists: everything)."""

    vhosts: list[str] = doc_field(doc="Vhosts to import.", factory=list)
    queues: list[str] = doc_field(doc="Queues to import (globs or exact names).", factory=list)
    exchanges: list[str] = doc_field(doc="Exchanges to import (globs or exact names).", factory=list)


TimeBound = Union[int, str]


@dataclass(repr=False)
class RestoreOptions(_Section):
    """How a restore publishes."""

    time_window_start: Optional[TimeBound] = doc_field(None, "PITR: only records with `backed_up_at` >= this (epoch ms or RFC 3339).")
    time_window_end: Optional[TimeBound] = doc_field(None, "PITR: only records with `backed_up_at` <= this (epoch ms or RFC 3339).")
    restore_definitions: bool = doc_field(False, "Import the backup's definitions before the messages "
                                          "(a rollback snapshot of the target's definitions is stored first).")
    definitions_dry_run: bool = doc_field(False, "Report what the definitions import would change, import nothing.")
    definitions_selection: DefinitionsSelection = doc_field(doc="Subset of the definitions to import.", factory=DefinitionsSelection)
    restore_messages: bool = doc_field(True, "Publish the backed-up messages.")
    queues: QueueSelection = doc_field(doc="Which backed-up queues to restore (names as in the backup).", factory=QueueSelection)
    publish_mode: Literal["exchange", "queue"] = doc_field(
        "queue", "`queue` (default): straight to the (remapped) queue via the default exchange: restores exactly "
        "the backed-up queue and resumes exactly once; `exchange`: original exchange and routing key (current "
        "bindings decide; a fan-out bound to several backed-up queues delivers copies).")
    publisher_confirms: bool = doc_field(True, "Count a record as restored only once the broker confirmed it.")
    protocol: Literal["auto", "amqp091", "amqp10"] = doc_field(
        "auto", "How records are published. `auto` (default) and `amqp091`: AMQP 0-9-1, on every broker (measured: "
        "AMQP 1.0 was not faster on 4.0 or 4.3, docs/performance.md); `amqp10`: AMQP 1.0 (Qpid Proton, 4.x, no TLS) "
        "for classic and quorum queues in `queue` mode, each record 1.0 carries exactly (streams and `exchange` mode "
        "stay on 0-9-1).")
    max_concurrent_queues: int = doc_field(4, "Queues restored at the same time.", min=1, max=256)
    produce_batch_size: int = doc_field(500, "Messages in flight (unconfirmed) per queue.", min=1, max=100_000)
    dry_run: bool = doc_field(False, "Read and report what would be published; publish nothing.")
    checkpoint_state: Optional[str] = doc_field(None, "Local file recording restore progress, so a rerun resumes without "
                                                "duplicates. Unset (the default): no checkpoint, a rerun of a killed "
                                                "restore does not resume (it finds its targets non-empty). A relative path is relative to the working "
                                                "directory (read-only in the image: use `${RBAK_STATE_DIR}/...`).")
    vhost_mapping: dict[str, str] = doc_field(doc="Restore vhost `src` into vhost `dst` (`{src: dst}`).", factory=dict)
    queue_mapping: dict[str, str] = doc_field(doc="Rename queues: key `vhost/queue` or `queue`, value the new queue name.", factory=dict)
    allow_non_empty: bool = doc_field(False, "Publish into queues that already hold messages (refused by default).")
    skip_existing: bool = doc_field(False, "Skip (instead of failing on) target queues that already hold messages.")
    allow_lossy_target: bool = doc_field(
        False, "Publish into target queues whose arguments or policies may drop, expire or dead-letter restored "
        "messages (a max-length/max-length-bytes without room for them, a message-ttl, an expires); refused "
        "before anything is published by default. Either way a restore fails when a target holds fewer "
        "messages afterwards than the broker confirmed.")
    allow_oversize_skip: bool = doc_field(
        False, "A record whose body is over the target's `max_message_size` (4.x reports it; 4.x's default is "
        "16 MiB, 3.x allowed 128 MiB) refuses the whole restore before anything is published; with this, such records "
        "are skipped and each is listed in the summary (`oversize_skipped`) instead.")
    overwrite_users: bool = doc_field(False, "Let the definitions import replace an existing user's password hash, tags "
                                      "and permissions (by default the target's users and permissions are kept).")
    definitions_strict: bool = doc_field(False, "Refuse definitions the target would reject (e.g. 3.x `ha-*` policies, "
                                         "CQv1 queues on 4.3) instead of adapting them; lists every one, changes nothing.")
    transient_queues: Literal["durable", "skip"] = doc_field(
        "durable", "Transient non-exclusive queues on a target that denies them: declare them `durable`, or `skip` "
        "them (and their messages).")
    write_dir: Optional[str] = doc_field("./rbak-restore", "What a restore writes besides the target (the definitions "
                                         "rollback snapshot, the restore report) goes beside the backup; when the "
                                         "storage refuses the write (a read-only mount or read-only credentials), into "
                                         "this local directory instead, under the same key, named in the summary "
                                         "(`wrote:`). Unset (`null`): such a refusal fails the restore. A restore of "
                                         "messages alone writes nothing to the storage.")
    increment_only: bool = doc_field(False, "A stream from an incremental backup: restore that backup's own offsets only. "
                                     "Default: base through the chosen backup, every offset once, in order.")

    def window_ms(self) -> tuple[int | None, int | None]:
        """The PITR window as epoch milliseconds."""
        return (parse_time_bound(self.time_window_start, "restore.time_window_start"),
                parse_time_bound(self.time_window_end, "restore.time_window_end"))


@dataclass(repr=False)
class OffsetStorageConfig(_Section):
    """The SQLite checkpoint (`offsets.db`) that makes a killed backup resumable and streams incremental."""

    backend: Literal["sqlite"] = doc_field("sqlite", "Checkpoint store (only `sqlite`).")
    path: str = doc_field("./.rbak-state/offsets.db", "Local SQLite file.")
    s3_key: Optional[str] = doc_field(None, "Storage key the database is synced to; default `{prefix}/{backup_id}/state/offsets.db`.")
    sync_interval_secs: float = doc_field(30.0, "How often the local database is copied to storage.", min=0)


@dataclass(repr=False)
class MetricsConfig(_Section):
    """Prometheus metrics endpoint."""

    enabled: bool = doc_field(False, "Serve Prometheus metrics while running.")
    port: int = doc_field(8080, "Metrics port.", min=0, max=65535)
    path: str = doc_field("/metrics", "Metrics URL path.")
    bind: str = doc_field("0.0.0.0", "Address to listen on.")


@dataclass(repr=False)
class EncryptionConfig(_Section):
    """Client-side encryption (AES-256-GCM) of segments, definitions and state: rbak's own extension of
    the format (the Rust tool cannot read encrypted backups). The manifest stays plaintext and names the
    key id (with `envelope`: the backup's own data key, stored wrapped under `keys/`). Keys are read from `keys_env`/`RBAK_ENCRYPTION_KEYS` and `keys_file` whenever a backup is
    read, so restore and validate of encrypted backups need only the keys, not `enabled`."""

    enabled: bool = doc_field(False, "Encrypt this backup (with the key `key_id`). A `mode: backup` or `mode: archive` config that names "
                              "`key_id`, `keys_file`, `keys_env`, `envelope` or `kms_key_id` without `enabled: true` is "
                              "refused (exit 2): a key in the config never leaves a backup in plaintext silently. "
                              "Restore and drill configs name keys without it, to read encrypted backups.")
    key_id: Optional[str] = doc_field(None, "Id of the key new backups are encrypted with (required when `enabled`, "
                                      "unless `envelope` with `kms_key_id`); recorded in the manifest, so older keys "
                                      "stay usable after a rotation. With `envelope`: the keyring key that wraps each "
                                      "backup's data key.")
    keys_file: Optional[str] = doc_field(None, "Keyring: a YAML/JSON file `{key id: base64 key}` (a bare base64 key "
                                         "is `key_id`'s), or a directory with one file per key id (a mounted Kubernetes Secret).")
    keys_env: Optional[str] = doc_field(None, "Environment variable holding a keyring in the same format "
                                        "(`RBAK_ENCRYPTION_KEYS` is always read when set).")

    envelope: bool = doc_field(False, "Envelope encryption: each new backup gets its own random data key, stored "
                               "only wrapped by `key_id` (a keyring key) and/or `kms_key_id` (AWS KMS), so keys "
                               "rotate with `rbak keys rewrap` without re-encrypting backups.")
    kms_key_id: Optional[str] = doc_field(None, "AWS KMS key (id, ARN or `alias/...`) that also wraps each new "
                                          "backup's data key (needs `envelope: true`).")
    kms_region: Optional[str] = doc_field(None, "KMS region; default the key ARN's region, else the AWS default "
                                          "(`AWS_REGION`).")
    kms_endpoint_url: Optional[str] = doc_field(None, "KMS endpoint URL (a VPC endpoint, or a test server); default "
                                                "`AWS_ENDPOINT_URL_KMS`, else AWS.")

    def keyring(self) -> dict[str, bytes]:
        from ..sealing.crypto import load_keyring  # noqa: PLC0415 - rbak.config stays light, see model.LAYOUT_LAZY

        return load_keyring(self.keys_file, self.keys_env, self.key_id)

    def kms(self) -> KmsSettings:
        from ..sealing.envelope import KmsSettings  # noqa: PLC0415 - rbak.config stays light, see model.LAYOUT_LAZY

        return KmsSettings(self.kms_region, self.kms_endpoint_url)

    def key_sources(self) -> KeySources:
        """Every key-encryption key this config gives, and those a new backup's data key is wrapped by."""
        from ..sealing.envelope import KEYRING, KMS, Kek, KeySources  # noqa: PLC0415 - rbak.config stays light, see model.LAYOUT_LAZY

        wrap_with = ((Kek(KEYRING, self.key_id),) if self.key_id else ()) + (
            (Kek(KMS, self.kms_key_id),) if self.kms_key_id else ())
        return KeySources(self.keyring(), self.kms(), wrap_with)


@dataclass(repr=False)
class TapsConfig(_Section):
    """Queue taps (`archive.taps`): classic and quorum queues archived through a stream `rbak.tap.<queue>` that
    `rbak archive` declares and binds as the queue is bound. It records what exchanges route to the queue, not
    what remained in it; what is published straight to the queue (the default exchange) is not recorded."""

    include: list[str] = doc_field(doc="Queues to tap (globs or exact names; `vhost/queue` when the pattern has a "
                                   "`/`), as `source.queues`. Required: nothing is tapped by default.", factory=list)
    exclude: list[str] = doc_field(doc="Queues not to tap (globs or exact names); wins over `include`.", factory=list)
    vhosts: list[str] = doc_field(doc="Vhosts to look in; empty: those of `source.queues.vhosts` (every vhost when "
                                  "that is empty too).", factory=list)
    max_age: str = doc_field("7D", "Retention of each tap stream (`x-max-age`: a number and `Y`, `M`, `D`, `h`, `m` "
                             "or `s`): how long it keeps what the archiver has not read yet, e.g. while it is down.")
    max_length_bytes: int = doc_field(10 * 1024 ** 3, "Size cap of each tap stream (`x-max-length-bytes`), at least "
                                      "1000000.",
                                      min=1_000_000)


@dataclass(repr=False)
class ArchiveOptions(_Section):
    """Continuous stream archiving (`rbak archive`, `mode: archive`): every stream `source.queues` selects is
    followed and archived as generations of backups named `<name>.<UTC time>` (docs/archive.md)."""

    name: str = doc_field("archive", "The archive's name: its generations are the backups `<name>.<UTC time>` "
                          "(letters, digits, `.`, `_`, `-`).")
    max_delay_secs: float = doc_field(5.0, "A segment is closed, stored and named by a tick at most this long "
                                      "after its first record arrived: the recovery point.", min=0.2, max=3600)
    idle_tick_secs: float = doc_field(30.0, "With nothing new to archive, the watermark (recoverable-until) is "
                                      "still written, at most this often.", min=1, max=86400)
    generation_ticks: int = doc_field(720, "Ticks after which a generation is closed (its manifest written) and "
                                      "the next one starts.", min=1, max=100_000)
    retry_secs: float = doc_field(5.0, "Wait after a failure (broker, storage, a stream gone) before the archive "
                                  "starts again from what storage holds.", min=0.1, max=3600)
    relist_secs: float = doc_field(30.0, "How often the stream selection is listed again when no tick is due "
                                   "(new, deleted or recreated streams start a new generation); every tick lists it "
                                   "too, and recoverable-until never passes the last listing.", min=1, max=86400)
    taps: Optional[TapsConfig] = doc_field(None, "Classic and quorum queues to archive continuously through a tap "
                                           "stream each (docs/archive.md, \"Queue taps\").")


@dataclass(repr=False)
class DrillConfig(_Section):
    """Restore drills (`rbak drill`): restore a backup (default the newest complete one) into a fresh
    scratch vhost, compare per-queue message counts and record hashes with the backup, delete the vhost."""

    target: Optional[ConnectionConfig] = doc_field(None, "Broker the scratch vhost is created on; default "
                                                   "`source` (else `target`). Its user needs the administrator tag.")
    scratch_vhost_prefix: str = doc_field(SCRATCH_VHOST_PREFIX, "Scratch vhosts are named "
                                          "`<prefix>-<backup id>-<random>` (letters, digits, `.`, `_`, `-`).")
    read_timeout_secs: float = doc_field(10.0, "Reading messages back from a scratch queue stops after this long "
                                         "without a delivery.", min=0.1, max=3600)
    store_report: bool = doc_field(True, "Store the report next to the backup (`drills/<time>-<id>.json`, "
                                   "a new object per drill).")
    signing_key_file: Optional[str] = doc_field(None, "Ed25519 private key (PEM, PKCS#8, unencrypted) that signs "
                                                "each drill report; check one with `rbak drill verify REPORT "
                                                "--public-key PUB.pem`.")
    signing_key_env: Optional[str] = doc_field(None, "Name of an environment variable holding that key's PEM "
                                               "instead (how the operator passes it from a Secret); not with "
                                               "`signing_key_file`.")
    lookback_secs: float = doc_field(300.0, "A drill of a continuous archive (`rbak drill --archive NAME`) restores "
                                     "the archive as it was this long ago (never past its recoverable-until) and "
                                     "compares it with the live streams, which must still hold those offsets.",
                                     min=0, max=7 * 86400)
