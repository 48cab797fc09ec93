"""``rbak import rabbitmq-dir`` against data directories written by real RabbitMQ nodes.

Private nodes (never the shared brokers) write the files: 3.10.8 (CQv1 and
x-queue-version 2, clean stop; queue_index_embed_msgs_below = 0; SIGKILL with
entries split between segments and journal) and 4.0.5 in the trixie chroot
(CQv2 only). The import must give exactly the published messages that were
not acked - bodies, order, exchange, routing key, every property and header -
and must not change a byte of the node's directory.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pika
import pytest
from support.private_node import rawable
from support.node_dirs import qdir, read_backup, scenario, shared_root, snapshot  # noqa: F401 - shared_root is a fixture
from support.node_scenarios import ALL_HEADERS_EXP, ALL_HEADERS_PUB, VHOST2, Msg

from rbak.cli import main as rbak_main
from rbak.errors import ImportFormatError, PropertiesError, TermError
from rbak.format.manifest import BackupManifest
from rbak.format.record import (
    Array, BackupProperties, Bool, Long, LongString, Table, Timestamp, decimal_header,
)
from rbak.offline.rabbitmq import amqp_props, cqv1, erlang_terms
from rbak.offline.rabbitmq.damage import ImportContext
from rbak.offline.rabbitmq.rabbitmq_dir import import_rabbitmq_dir, queue_dir_name, vhost_dir_name
from rbak.storage import open_storage


# --------------------------------------------------------------------------
# Fixtures: one data dir per scenario per test run.
# --------------------------------------------------------------------------


def as_msgs(recs) -> list[Msg]:
    return [Msg(r.body, r.exchange, r.routing_key, r.properties, r.headers) for r in recs]


# --------------------------------------------------------------------------
# Real data directories.
# --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["main-3.10", "store-only", "crash", "main-4.0"])
def test_import_gives_exactly_the_unacked_messages(name, shared_root, tmp_path, capsys):
    sc = scenario(name, shared_root)
    before = snapshot(sc.data_dir)
    url = f"file://{tmp_path}/backups"
    # Classic queues only: this scenario's stream and quorum queue must be named as left out.
    rc = rbak_main(["import", "rabbitmq-dir", str(sc.data_dir), "--to", url, "--backup-id", "imp-1",
                    "--types", "classic"])
    assert rc == 0, capsys.readouterr()
    assert snapshot(sc.data_dir) == before, "the importer changed the broker's files"

    m, got = read_backup(url, "imp-1")
    assert m.completed_at is not None and m.completed_at >= m.created_at
    assert m.source_cluster == sc.data_dir.name
    assert {q.queue_type for q in m.queues} == {"classic"}
    assert m.total_messages == sum(len(v) for v in got.values())
    for key, expected in sc.expected.items():
        if expected is None:
            continue
        recs = got.get(key, [])  # a queue that never held a message may have no directory
        assert len(recs) == len(expected), key
        assert as_msgs(recs) == expected, key
        for r in recs:
            assert (r.source_vhost, r.source_queue) == key
        seqs = [r.delivery_tag for r in recs]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), "records must be in SeqId order"
    assert set(got) <= set(sc.expected), set(got) - set(sc.expected)

    out = capsys.readouterr().out
    for (vhost, queue), v in sc.versions.items():
        assert f"vhost {vhost!r} queue {queue!r} (index v{v})" in out
    if name.startswith("main-"):  # it declared one quorum queue and one stream
        assert "note: 1 quorum queue(s) on this node" in out and "note: 1 stream(s) on this node" in out, out
    else:
        assert "NOT in this backup" not in out, out

    if sc.dlx:
        _check_dead_lettered(got[("/", "dlx-target")], name)
    if name == "store-only":
        # Every message really lives in the .rdq store (nothing embedded, no .qs).
        d1 = qdir(sc.data_dir, "/", "v1-store")
        entries = list(cqv1.iter_index(str(d1), 2048, ImportContext()))
        assert len(entries) == 8 and all(e.pub.emb_end == e.pub.emb_start for e in entries)
        assert not list(qdir(sc.data_dir, "/", "v2-store").glob("*.qs"))
    if name == "crash":
        # The SIGKILL left entries in the v1 journal as well as in a segment.
        d1 = qdir(sc.data_dir, "/", "v1-crash")
        assert (d1 / "journal.jif").stat().st_size > 0 and (d1 / "0.idx").stat().st_size > 0
    if name == "main-3.10":
        # CQv1 with 2048 entries per segment: the 2100-message queue spans two .idx files.
        assert (qdir(sc.data_dir, VHOST2, "q-ünï-✓") / "1.idx").exists()
    if name in ("main-3.10", "main-4.0"):
        # CQv2 with 4096 entries per segment: the 4200-message queue spans two .qi files.
        assert (qdir(sc.data_dir, VHOST2, "many-v2") / "1.qi").exists()

    from rbak.repo.validate import validate_backup

    assert validate_backup(open_storage(url), "imp-1", "", deep=True).ok


def _check_dead_lettered(recs, name: str) -> None:
    assert len(recs) == 1
    r = recs[0]
    assert (r.body, r.exchange, r.routing_key) == (b"dead", "", "dlx-target")
    h = dict(r.headers)
    for k, v in ALL_HEADERS_EXP:
        assert h[k] == v, k
    (death,) = h["x-death"].value
    d = dict(death.value)
    assert d["count"] == Long(1)
    assert d["reason"] == LongString("expired")
    assert d["queue"] == LongString("dlx-src")
    assert d["exchange"] == LongString("")
    assert d["routing-keys"] == Array((LongString("dlx-src"),))
    assert d["original-expiration"] == LongString("1")
    assert isinstance(d["time"], Timestamp)
    assert h["x-first-death-queue"] == LongString("dlx-src")
    assert r.properties.expiration is None  # dead-lettering removed the per-message TTL
    assert r.properties.delivery_mode == 2


@pytest.mark.slow
def test_names_recovered_when_name_files_are_missing(shared_root, tmp_path):
    """Without .vhost/.queue_name, names come from Mnesia, then from the messages; all checked by hash."""
    sc = scenario("main-3.10", shared_root)
    copy = tmp_path / sc.data_dir.name
    shutil.copytree(sc.data_dir, copy)
    for p in list(copy.rglob(".queue_name")) + list(copy.rglob(".vhost")):
        p.unlink()
    res = import_rabbitmq_dir(str(copy), "memory://names-1", "n1", types={"classic"})  # the scenario's classic queues
    names = {(q.vhost, q.name): q.exported for q in res.queues}
    want = res_expected(sc)
    assert names == {k: n for k, n in want.items() if k != (VHOST2, "empty")}  # 'empty' has no directory

    # Without Mnesia too: vhosts and default-exchange routing keys from the stored messages.
    for p in [*copy.glob("*.DC[DL]"), *copy.glob("*.LOG"), *copy.glob("*.DAT")]:
        p.unlink()
    res = import_rabbitmq_dir(str(copy), "memory://names-2", "n2", skip_damaged=True, types={"classic"})
    names = {(q.vhost, q.name) for q in res.queues}
    assert {("/", "v1-mixed"), ("/", "v2-mixed"), ("/", "dlx-target"), (VHOST2, "q-ünï-✓"), (VHOST2, "many-v2")} <= names


def res_expected(sc) -> dict:
    return {k: (len(v) if v is not None else 1) for k, v in sc.expected.items()}


@pytest.mark.slow
def test_cli_filters_and_refuses_to_overwrite(shared_root, tmp_path, capsys):
    sc = scenario("main-3.10", shared_root)
    url = f"file://{tmp_path}/b"
    args = ["import", "rabbitmq-dir", str(sc.data_dir), "--to", url, "--backup-id", "f1",
            "--vhost", VHOST2, "--queue", "many-v2", "--compression", "lz4", "--prefix", "pre/fix"]
    assert rbak_main(args) == 0
    st = open_storage(url)
    m = BackupManifest.from_json(st.get("pre/fix/f1/manifest.json"))
    assert [(q.vhost, q.name, q.message_count) for q in m.queues] == [(VHOST2, "many-v2", 4195)]
    assert all(s.key.endswith(".lz4") for q in m.queues for s in q.segments)
    keys_before = sorted(st.list(""))
    assert rbak_main(args) == 2  # same id again: refused, nothing touched
    assert "already exists" in capsys.readouterr().err
    assert sorted(st.list("")) == keys_before


# --------------------------------------------------------------------------
# Damaged files: a clear error naming file and offset; --skip-damaged exports the rest.
# --------------------------------------------------------------------------


def _truncate(p: Path, size: int) -> None:
    with open(p, "r+b") as f:
        f.truncate(size)


def _overwrite(p: Path, offset: int, data: bytes) -> None:
    with open(p, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _damage_idx(d: Path) -> tuple[Path, str, tuple]:
    p = qdir(d, VHOST2, "q-ünï-✓") / "0.idx"
    data = p.read_bytes()
    # Cut inside the 100th record: every record here is a 34-byte publish + embedded term, or 2 bytes.
    _truncate(p, len(data) // 2)
    return p, r"truncated (publish record|embedded message|record)", (VHOST2, "q-ünï-✓")


def _damage_idx_garbage(d: Path) -> tuple[Path, str, tuple]:
    p = qdir(d, "/", "v1-mixed") / "0.idx"
    _overwrite(p, 0, b"\x00\x07")  # prefix 00 does not exist
    return p, r"at byte 0: unknown record prefix", ("/", "v1-mixed")


def _damage_jif(d: Path) -> tuple[Path, str, tuple]:
    p = qdir(d, "/", "v1-crash") / "journal.jif"
    _truncate(p, p.stat().st_size - 3)
    return p, r"truncated", ("/", "v1-crash")


def _damage_qi(d: Path) -> tuple[Path, str, tuple]:
    p = qdir(d, VHOST2, "many-v2") / "0.qi"
    _truncate(p, 64 + 32 * 100 + 10)
    return p, rf"at byte {64 + 32 * 100}: truncated entry", (VHOST2, "many-v2")


def _damage_qi_magic(d: Path) -> tuple[Path, str, tuple]:
    p = qdir(d, "/", "v2-mixed") / "0.qi"
    _overwrite(p, 0, b"JUNK")
    return p, r"at byte 0: bad magic", ("/", "v2-mixed")


def _damage_qs(d: Path) -> tuple[Path, str, tuple]:
    p = qdir(d, "/", "v2-mixed") / "0.qs"
    _truncate(p, p.stat().st_size - 5)
    return p, r"at byte \d+: SeqId \d+: truncated entry", ("/", "v2-mixed")


def _live_qs_offset(q: Path) -> tuple[int, int]:
    """(SeqId, .qs offset) of the first unacked message kept in the per-queue store."""
    data = (q / "0.qi").read_bytes()
    for pos in range(64, len(data), 32):
        if data[pos] == 1 and data[pos + 3] == 2:
            return (pos - 64) // 32, int.from_bytes(data[pos + 4 : pos + 12], "big")
    raise AssertionError("no live .qs entry")


def _damage_qs_garbage(d: Path) -> tuple[Path, str, tuple]:
    q = qdir(d, "/", "v2-mixed")
    seq, off = _live_qs_offset(q)
    _overwrite(q / "0.qs", off + 8 + 30, bytes(random.Random(1).randrange(256) for _ in range(16)))
    return q / "0.qs", rf"at byte {off}: SeqId {seq}: ", ("/", "v2-mixed")


def _damage_rdq(d: Path) -> tuple[Path, str, tuple]:
    store = d / "msg_stores" / "vhosts" / vhost_dir_name("/") / "msg_store_persistent"
    (p,) = [p for p in store.glob("*.rdq") if p.stat().st_size > 300_000]
    _truncate(p, p.stat().st_size - 1000)  # the last record (a big one) loses its end
    return p, r"\d+\.rdq at byte \d+: truncated record", ("/", "v2-mixed")


DAMAGES = {
    "idx-truncated": ("main-3.10", _damage_idx),
    "idx-garbage": ("main-3.10", _damage_idx_garbage),
    "jif-truncated": ("crash", _damage_jif),
    "qi-truncated": ("main-3.10", _damage_qi),
    "qi-bad-magic": ("main-3.10", _damage_qi_magic),
    "qs-truncated": ("main-3.10", _damage_qs),
    "qs-garbage": ("main-3.10", _damage_qs_garbage),
    "rdq-truncated": ("main-3.10", _damage_rdq),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(DAMAGES))
def test_damaged_files(case, shared_root, tmp_path, capsys):
    name, damage = DAMAGES[case]
    sc = scenario(name, shared_root)
    copy = tmp_path / sc.data_dir.name
    shutil.copytree(sc.data_dir, copy)
    path, pattern, damaged_queue = damage(copy)

    url = f"file://{tmp_path}/b"
    with pytest.raises(ImportFormatError) as ei:
        import_rabbitmq_dir(str(copy), url, "d1")
    msg = str(ei.value)
    assert str(path.name) in msg and "at byte" in msg, msg
    import re

    assert re.search(pattern, msg), msg
    if path.suffix != ".rdq":  # a queue's own file: the error names the queue, not just its hashed directory
        assert f"queue {damaged_queue[1]!r} in vhost {damaged_queue[0]!r}: " in msg, msg
    assert not (tmp_path / "b" / "d1").exists() or not list((tmp_path / "b" / "d1").rglob("*")), \
        "a failed import must not leave a backup behind"

    # --skip-damaged: everything else is exported; the damage is reported.
    args = ["import", "rabbitmq-dir", str(copy), "--to", url, "--backup-id", "d2", "--skip-damaged"]
    assert rbak_main(args) == 3  # partial: the manifest records what was skipped
    err = capsys.readouterr().err
    assert "skipped" in err and path.name in err, err
    _, got = read_backup(url, "d2")
    for key, expected in sc.expected.items():
        if expected is None or key == damaged_queue:
            continue
        assert as_msgs(got.get(key, [])) == expected, key
    # The damaged queue keeps only messages that really were published to it, in order (a lost
    # ack record can bring an acked message back: at-least-once, like RabbitMQ's own recovery).
    pub = sc.published[damaged_queue]
    kept = as_msgs(got.get(damaged_queue, []))
    assert len(kept) <= len(sc.expected[damaged_queue])
    assert all(m in pub for m in kept)
    idx = [pub.index(m) for m in kept]
    assert idx == sorted(idx)


# --------------------------------------------------------------------------
# The decoders on their own (no broker), cross-checked against real Erlang.
# --------------------------------------------------------------------------


def _erl_term_to_binary(expr: str, opts: str) -> bytes:
    code = f'io:format("~w", [binary_to_list(term_to_binary({expr}, {opts}))]), halt().'
    out = subprocess.run(["erl", "-noshell", "-eval", code], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    return bytes(int(x) for x in out.strip()[1:-1].split(",") if x)


def test_erlang_terms_match_real_erlang_both_atom_encodings():
    expr = ('{basic_message, \'ünï\', [<<"rk">>, "str", 1.5, -7, 300, 1 bsl 70, -(1 bsl 70)], '
            '#{x => <<>>, <<"k">> => [a | b]}, <<1:3>>, [], true, undefined}')
    want = (
        "basic_message", "ünï", [b"rk", list(b"str"), 1.5, -7, 300, 1 << 70, -(1 << 70)],
        {"x": b"", b"k": erlang_terms.ImproperList(["a"], "b")},
        erlang_terms.BitBinary(b"\x20", 3), [], "true", "undefined",
    )
    latin1 = _erl_term_to_binary(expr, "[{minor_version, 1}]")
    utf8 = _erl_term_to_binary(expr, "[{minor_version, 2}]")
    compressed = _erl_term_to_binary(expr, "[compressed, {minor_version, 2}]")
    assert latin1 != utf8 and compressed[1] == 80
    assert b"d\x00\x0dbasic_message" in latin1 and b"w\x0dbasic_message" in utf8
    for data in (latin1, utf8, compressed):
        t = erlang_terms.binary_to_term(data)
        assert t == want
        assert isinstance(t[0], erlang_terms.Atom) and isinstance(t[2][0], bytes)
    # Cross-check with erlang-py's reading of the same bytes.
    import erlang

    ref = erlang.binary_to_term(utf8)
    assert ref[2][0].value == b"rk" and ref[2][5] == 1 << 70
    # Strictness: truncated and trailing input fail with an offset.
    with pytest.raises(TermError, match="at byte"):
        erlang_terms.binary_to_term(utf8[:-3])
    with pytest.raises(TermError, match="unparsed"):
        erlang_terms.binary_to_term(utf8 + b"\x00")
    assert erlang_terms.decode(utf8 + b"\x00\x00")[1] == len(utf8)


def test_amqp_properties_every_field_type():
    pub = pika.BasicProperties(content_type="text/plain", headers=ALL_HEADERS_PUB, delivery_mode=2,
                               priority=9, message_id="x", timestamp=5, cluster_id="c")
    data = rawable(pub).encode()
    props, headers = amqp_props.decode_properties(b"".join(data) if isinstance(data, list) else data)
    assert props == BackupProperties(content_type="text/plain", delivery_mode=2, priority=9, message_id="x",
                                     timestamp=5, cluster_id="c")
    assert headers == ALL_HEADERS_EXP
    raw_bin = b"".join(data) if isinstance(data, list) else data
    with pytest.raises(PropertiesError, match="at byte"):
        amqp_props.decode_properties(raw_bin[:-3])
    # The decoded 'P_basic' form (as a dead-lettered message on 3.10 is stored).
    A = erlang_terms.Atom  # noqa: N806 - Atom's short name in the literal terms below
    p_basic = (A("P_basic"), b"text/plain", A("undefined"),
               [(b"n", A("long"), 5), (b"t", A("table"), [(b"b", A("bool"), A("true"))]),
                (b"a", A("array"), [(A("longstr"), b"v"), (A("decimal"), (2, 12345))])],
               2, A("undefined"), A("undefined"), A("undefined"), A("undefined"), A("undefined"), 7,
               A("undefined"), A("undefined"), A("undefined"), A("undefined"))
    props, headers = amqp_props.from_p_basic(p_basic)
    assert props == BackupProperties(content_type="text/plain", delivery_mode=2, timestamp=7)
    assert headers == (("n", Long(5)), ("t", Table((("b", Bool(True)),))),
                       ("a", Array((LongString("v"), decimal_header(2, 12345)))))


def test_directory_names():
    assert vhost_dir_name("/") == "628WB79CIFDYO9LJI6DKMI09L"
    assert queue_dir_name("/", "myq") == "3A9KBWJBBQUI17XLUGYMIGL00"


def test_not_a_data_dir(tmp_path):
    with pytest.raises(ImportFormatError, match="no msg_stores/vhosts"):
        import_rabbitmq_dir(str(tmp_path), "memory://nd", "x")


# --------------------------------------------------------------------------
# End to end: import -> rbak restore into a fresh vhost of a CI broker -> consume.
# --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.broker
@pytest.mark.parametrize("name", ["main-3.10", "main-4.0"])
def test_imported_backup_restores_into_a_live_broker(name, shared_root, tmp_path, broker, vhost):
    from support.restores import consume_all, declare, expected_after_restore, headers_equal, options_for

    from rbak.restore import run_restore

    sc = scenario(name, shared_root)
    queues = [q for v, q in sc.expected if v == "/" and q.endswith("-mixed")] + ["dlx-target"]
    url = f"file://{tmp_path}/b"
    args = ["import", "rabbitmq-dir", str(sc.data_dir), "--to", url, "--backup-id", "e2e", "--vhost", "/"]
    for q in queues:
        args += ["--queue", q]
    assert rbak_main(args) == 0
    _, imported = read_backup(url, "e2e")
    for q in queues:
        declare(broker, vhost, q)
    summary = run_restore(open_storage(url), options_for(broker, "e2e", vhost_mapping=(("/", vhost),)))
    assert summary.ok, summary.to_json_obj()
    for q in queues:
        recs = imported[("/", q)]
        if sc.expected[("/", q)] is not None:
            assert as_msgs(recs) == sc.expected[("/", q)]
        got = consume_all(broker, vhost, q, len(recs))
        assert [d.body for d in got] == [r.body for r in recs], q
        for d, r in zip(got, recs):
            assert d.properties == r.properties, q
            assert headers_equal(d.headers, expected_after_restore(r.headers)), (q, d.headers, r.headers)


@pytest.mark.slow
def test_journal_stops_at_an_all_zero_entry(shared_root, tmp_path):
    """A dirty shutdown can leave a zeroed tail in journal.jif: RabbitMQ stops reading there, so do we."""
    sc = scenario("crash", shared_root)
    copy = tmp_path / sc.data_dir.name
    shutil.copytree(sc.data_dir, copy)
    with open(qdir(copy, "/", "v1-crash") / "journal.jif", "ab") as f:
        f.write(b"\x00" * 40 + b"\xde\xad\xbe\xef" * 5)
    url = f"file://{tmp_path}/b"
    res = import_rabbitmq_dir(str(copy), url, "z1")
    assert not res.ctx.skipped
    _, got = read_backup(url, "z1")
    assert as_msgs(got[("/", "v1-crash")]) == sc.expected[("/", "v1-crash")]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["main-3.10", "main-4.0"])
def test_fast_path_equals_general_decoder(name, shared_root):
    """Every stored message term of a real node: the fast reader and the general decoder agree."""
    from rbak.offline.rabbitmq.erlang_terms import decode
    from rbak.offline.rabbitmq.msg_store import HEADER, MessageStore
    from rbak.offline.rabbitmq.stored_message import fast_decode, message_from_term

    sc = scenario(name, shared_root)
    seen = 0
    for store_dir in sc.data_dir.glob("msg_stores/vhosts/*/msg_store_persistent"):
        store = MessageStore(str(store_dir), ImportContext())
        store._scan()
        for loc in store.index.values():
            data = store.files[loc.file].pread(loc.offset + HEADER, loc.size - 16)
            term, end = decode(data, 0)
            fast = fast_decode(data)
            assert fast is not None and fast[1] == end == len(data)
            assert fast[0] == message_from_term(term)
            seen += 1
        store.close()
    assert seen >= 5
