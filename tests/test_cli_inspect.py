"""``rbak list/describe/validate`` as a user runs them: a real process, real storage."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from rbak.format.manifest import BackupManifest
from rbak.format.layout import BackupLayout
from rbak.storage import open_storage
from rbak_spark.synthetic import QueueSpec, write_backup

QUEUES = [QueueSpec("/", "orders", 300, 200), QueueSpec("staging", "a/b ..%", 120, 100)]


def rbak(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


@pytest.fixture(params=["file", "s3"])
def url(request, tmp_path):
    if request.param == "file":
        return f"file://{tmp_path}/backups"
    return str(request.getfixturevalue("s3_bucket"))


def test_list_describe_validate(url):
    s = open_storage(url)
    m = write_backup(s, "nightly-1", QUEUES, segment_max_bytes=8 * 1024)
    write_backup(s, "nightly-2", QUEUES[:1])
    # An interrupted backup: manifest with completed_at null, and one with no manifest at all.
    bad = BackupManifest.from_json(s.get(BackupLayout("nightly-2").manifest))
    bad.backup_id, bad.completed_at = "interrupted", None
    s.put(BackupLayout("interrupted").manifest, bad.to_json())
    s.put("no-manifest/queues/_default/q/segment-0001.zst", b"x")

    out = rbak("list", "--path", url, "--format", "json")
    assert out.returncode == 0, out.stderr
    status = {e["backup_id"]: e["status"] for e in json.loads(out.stdout)}
    assert status == {"nightly-1": "complete", "nightly-2": "complete", "interrupted": "incomplete",
                      "no-manifest": "incomplete"}
    text = rbak("list", "--path", url)
    assert "nightly-1" in text.stdout and "incomplete" in text.stdout

    d = json.loads(rbak("describe", "--path", url, "--backup-id", "nightly-1", "--format", "json").stdout)
    assert d["backup_id"] == "nightly-1" and d["total_messages"] == 420 == m.total_messages
    assert {(q["vhost"], q["name"], q["message_count"]) for q in d["queues"]} == {("/", "orders", 300), ("staging", "a/b ..%", 120)}
    y = yaml.safe_load(rbak("describe", "--path", url, "--backup-id", "nightly-1", "--format", "yaml").stdout)
    assert y == d
    t = rbak("describe", "--path", url, "--backup-id", "nightly-1")
    assert t.returncode == 0 and "a/b ..%" in t.stdout

    for deep in ([], ["--deep"]):
        ok = rbak("validate", "--path", url, "--backup-id", "nightly-1", *deep)
        assert ok.returncode == 0, ok.stderr
        assert "is valid" in ok.stdout
    inc = rbak("validate", "--path", url, "--backup-id", "interrupted")
    assert inc.returncode == 1 and "incomplete" in inc.stderr


def test_deep_validate_reports_every_bad_segment(tmp_path):
    url = f"file://{tmp_path}"
    s = open_storage(url)
    m = write_backup(s, "b1", QUEUES, segment_max_bytes=4 * 1024)
    segs = [seg for q in m.queues for seg in q.segments]
    assert len(segs) >= 6
    flipped, truncated, missing, resized = segs[0], segs[2], segs[4], segs[-1]
    data = bytearray(s.get(flipped.key))
    data[50] ^= 0xFF
    s.put(flipped.key, bytes(data))
    s.put(truncated.key, s.get(truncated.key)[:-3])
    s.delete(missing.key)
    s.put(resized.key, s.get(resized.key) + b"\0")

    shallow = rbak("validate", "--path", url, "--backup-id", "b1")
    assert shallow.returncode == 1
    for seg in (truncated, missing, resized):
        assert seg.key in shallow.stderr
    assert "missing from storage" in shallow.stderr

    deep = rbak("validate", "--path", url, "--backup-id", "b1", "--deep", "--format", "json")
    assert deep.returncode == 1
    report = json.loads(deep.stdout)
    bad = {c["key"]: " ".join(c["problems"]) for c in report["segments"] if not c["ok"]}
    assert set(bad) == {flipped.key, truncated.key, missing.key, resized.key}
    assert "CRC32 mismatch" in bad[flipped.key] and "SHA-256 mismatch" in bad[flipped.key]
    assert "bad end magic" in bad[truncated.key] or "too short" in bad[truncated.key]
    assert "cannot read" in bad[missing.key]
    assert sum(c["ok"] for c in report["segments"]) == len(segs) - 4
    # one JSON object (issue 45): the report's fields, ok false, the exit code, the error's class and line
    assert (report["ok"], report["exit_code"], report["error"]["class"]) == (False, 1, "ValidationError")
    assert report["error"]["message"].startswith("Validation error: backup 'b1' is NOT valid: 4 bad segment(s), ")
    assert deep.stderr.strip().splitlines()[-1] == "rbak: " + report["error"]["message"]


def test_errors_are_one_clear_line_and_nonzero(tmp_path):
    r = rbak("describe", "--path", f"file://{tmp_path}", "--backup-id", "nope")
    assert r.returncode != 0 and "nope" in r.stderr and "Traceback" not in r.stderr
    r = rbak("list", "--path", "azure://acct.blob.core.windows.net/c")
    assert r.returncode != 0 and "not supported yet" in r.stderr and "Traceback" not in r.stderr
    r = rbak("validate", "--path", f"file://{tmp_path}", "--backup-id", "../etc")
    assert r.returncode != 0 and "backup_id" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{not json")
    r = rbak("describe", "--path", f"file://{tmp_path}", "--backup-id", "broken")
    assert r.returncode != 0 and "broken/manifest.json" in r.stderr and "not valid JSON" in r.stderr


def test_json_output_on_every_failure_is_one_object_of_the_documented_schema(tmp_path):
    """Issue 45: whatever fails (a usage error, a missing backup, a bad storage URL, prune with nothing
    to keep by), a command asked for JSON prints one object on stdout: ok false, exit code, error class
    and the one line stderr shows; `rbak config-reference --output-schema` describes it."""
    import jsonschema

    sch = rbak("config-reference", "--output-schema")
    assert sch.returncode == 0, sch.stderr
    schema = json.loads(sch.stdout)
    url = f"file://{tmp_path}"
    write_backup(open_storage(url), "b1", QUEUES[:1])
    cases = [
        (["describe", "--path", url, "--backup-id", "nope", "--format", "json"], 1, "NotFoundError"),
        (["list", "--path", "azure://acct.blob.core.windows.net/c", "--format", "json"], 1, "UnsupportedStorageError"),
        (["validate", "--path", url, "--backup-id", "b1", "--format", "json", "--bogus"], 2, "UsageError"),
        (["restore", "--path", url, "--backup-id", "b1", "--json", "--publish-mode", "nowhere"], 2, "UsageError"),
        (["prune", "--path", url, "--format", "json"], 2, "ConfigError"),
        (["backup", "--config", str(tmp_path / "missing.yaml"), "--json"], 2, "ConfigError"),
    ]
    for args, code, cls in cases:
        r = rbak(*args)
        assert r.returncode == code, (args, r.stderr)
        out = json.loads(r.stdout)
        jsonschema.validate(out, schema)
        assert (out["ok"], out["exit_code"], out["error"]["class"]) == (False, code, cls), (args, out)
        assert "rbak: " + out["error"]["message"] in r.stderr.splitlines(), (args, r.stderr)
    ok = rbak("list", "--path", url, "--format", "json")  # success: the command's own JSON, unchanged
    assert ok.returncode == 0 and [e["backup_id"] for e in json.loads(ok.stdout)] == ["b1"]
    jsonschema.validate(json.loads(ok.stdout), schema)
    d = json.loads(rbak("describe", "--path", url, "--backup-id", "b1", "--format", "json").stdout)
    assert d["backup_id"] == "b1" and "ok" not in d and "error" not in d
    jsonschema.validate(d, schema)


def test_deep_validate_reads_each_segments_largest_body_and_checks_the_manifests(tmp_path):
    """Issue 45: ``max_body_bytes`` (what a restore compares with the target's max_message_size) is read
    by --deep for any backup, older ones without the field too, and a manifest value that lies is a problem."""
    url = f"file://{tmp_path}"
    s = open_storage(url)
    m = write_backup(s, "b1", QUEUES[:1], segment_max_bytes=4 * 1024)
    segs = m.queues[0].segments
    assert all(seg.max_body_bytes for seg in segs)
    rep = json.loads(rbak("validate", "--path", url, "--backup-id", "b1", "--deep", "--format", "json").stdout)
    assert [c["max_body_bytes"] for c in rep["segments"]] == [seg.max_body_bytes for seg in segs] and rep["ok"]
    raw = json.loads(s.get("b1/manifest.json"))
    raw["queues"][0]["segments"][0]["max_body_bytes"] -= 1  # says the largest body is smaller than it is
    s.put("b1/manifest.json", json.dumps(raw).encode())
    r = rbak("validate", "--path", url, "--backup-id", "b1", "--deep", "--format", "json")
    bad = [c for c in json.loads(r.stdout)["segments"] if not c["ok"]]
    assert r.returncode == 1 and [c["key"] for c in bad] == [segs[0].key]
    assert bad[0]["problems"] == [f"manifest max_body_bytes {segs[0].max_body_bytes - 1}, largest body read "
                                  f"{segs[0].max_body_bytes}"]
    for q in raw["queues"]:  # an older backup: no field, and --deep still says each segment's largest body
        q.pop("max_body_bytes", None)
        for seg in q["segments"]:
            seg.pop("max_body_bytes")
    s.put("b1/manifest.json", json.dumps(raw).encode())
    rep = json.loads(rbak("validate", "--path", url, "--backup-id", "b1", "--deep", "--format", "json").stdout)
    assert rep["ok"] and [c["max_body_bytes"] for c in rep["segments"]] == [seg.max_body_bytes for seg in segs]
