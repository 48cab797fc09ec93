"""The operator at fleet scale, on a real Kubernetes API server (issue 30). A measurement.

For each operator (``poll``: the former fixed 10 s loop, the baseline, run from the git revision
``--baseline-rev`` that still had it; ``events``: this checkout's event-driven operator) in the
same run, on a fresh etcd + API server per phase (tests/support/kubeapi.py):

- **idle**: N RabbitMQBackups with a daily schedule whose slot is hours away, spread over 10
  namespaces; after the operator has settled, the requests it sends in a window (from the
  server's audit log, watches excluded), per object per hour; the operator's RSS and CPU.
  Targets: <= 1 request per object per hour, RSS <= 250 MiB at N = 1000, CPU < 2 % of a core.
  The 6-hourly safety resync (2 requests per object) is outside a short window: it is added
  to the figure as its hourly share.
- **latency**: a run's Job is marked complete (as the Job controller would); the time until the
  owner's ``status.lastRun`` says Succeeded. Median of 20. Target <= 2 s.
- **burst**: N objects whose slots fall in the same minute: the time from the slot until every
  Job exists, and that each slot has exactly one Job. Target <= 60 s for N = 1000.
- **archives** (issue 48, this checkout's operator only): N idle RabbitMQArchives whose storage (a
  PVC the operator reads, ``RBAK_OPERATOR_PVC_ROOT``) gets a new tick every 30 s, as an idle
  archiver writes it; the operator's requests in the window per object per hour (the Deployment and
  ConfigMap made at start-up are before it), the shares of what comes less often than a window added:
  the 6-hourly resync (one Deployment GET) and the status refresh of an idle archive (every 3 h).
  Then one archive's ticks fall 60 s behind: the time until its ``status.lagSeconds`` shows it.
  Targets: <= 1 request per object per hour; a lag change shown within 30 s.

    python benchmarks/operator_scale.py [--n 100 1000] [--window 120] [--modes poll events] [--baseline-rev REV]

Needs the cached API server binaries (.ci/setup). No broker: the Jobs are never run.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "operator"), str(REPO)]
from rbak.format.archive import Tick, TickStream, tick_key
from rbak.format.manifest import StreamInfo
from rbak_operator.decide.archive import IDLE_WRITE_SECS
from rbak_operator.decide.naming import manual_run_name, scheduled_run_name
from support.kubeapi import KubeApi, binaries_problem

NAMESPACES = 10
RESYNC_HOURS = 6.0
RESYNC_REQUESTS = 2  # a pass on an idle object: GET it, LIST its Jobs
ARCHIVE_RESYNC_REQUESTS = 1  # an idle archive's resync: GET its Deployment
ARCHIVE_TICK_SECS = 30  # an idle archiver's tick interval (rbak archive's idle_tick_secs, as the operator sets it)
BASELINE_REV = "57952a1"  # the last revision whose operator passed every 10 s (issue 30's "today")
OPERATOR_DIRS: dict[str, Path] = {"events": REPO / "operator"}


def checkout_baseline(rev: str, into: Path) -> Path:
    """The operator package of ``rev`` with the rbak of the same revision (git archive): rbak's module paths
    move between revisions, so the former operator cannot run beside this checkout's rbak."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "operator", "rbak"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "operator"


class Server:
    """A fresh API server with our CRDs, and a small JSON client for it (user agent ``bench``)."""

    def __init__(self, workdir: Path) -> None:
        self.kube = KubeApi.start(workdir)
        self.kube.kubectl("apply", "-f", str(REPO / "crds"))
        self.kube.wait_established("rabbitmqbackups.rbak.io", "rabbitmqrestores.rbak.io", "rabbitmqarchives.rbak.io")
        self.ctx = ssl.create_default_context(cafile=str(self.kube.ca_file))
        self._audit_pos = 0

    def call(self, method: str, path: str, body: object = None, ctype: str = "application/json") -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.kube.server + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.kube.token}", "Content-Type": ctype, "User-Agent": "bench"})
        return json.loads(urllib.request.urlopen(req, context=self.ctx, timeout=60).read())

    def backups(self) -> list[dict]:
        return self.call("GET", "/apis/rbak.io/v1alpha1/rabbitmqbackups")["items"]

    def jobs(self) -> list[dict]:
        return self.call("GET", "/apis/batch/v1/jobs")["items"]

    def mark(self) -> None:
        """Start counting requests from here."""
        self._audit_pos = self.kube.audit_log.stat().st_size if self.kube.audit_log.exists() else 0

    def operator_requests(self) -> int:
        """Non-watch requests since mark() made by the operator (not by us, kubectl or the server)."""
        with open(self.kube.audit_log, "rb") as f:
            f.seek(self._audit_pos)
            lines = f.read().splitlines()
        n = 0
        for line in lines:
            ev = json.loads(line)
            agent = ev.get("userAgent", "")
            if ev.get("stage") != "ResponseComplete" or ev.get("verb") == "watch":
                continue
            if agent.startswith(("bench", "kubectl/")) or (ev.get("user") or {}).get("username") == "system:apiserver":
                continue
            n += 1
        return n

    def stop(self) -> None:
        self.kube.stop()


def backup_body(name: str, ns: str, schedule: str | None) -> dict:
    spec: dict = {"broker": {"amqpUrl": f"amqp://{name}.{ns}.svc:5672/", "managementUrl": f"http://{name}.{ns}.svc:15672",
                             "credentialsSecretRef": {"name": "rmq"}},
                  "storage": {"pvc": {"claimName": "backups"}}, "validate": {"enabled": False}}
    if schedule:
        spec["schedule"] = schedule
    return {"apiVersion": "rbak.io/v1alpha1", "kind": "RabbitMQBackup", "metadata": {"name": name, "namespace": ns},
            "spec": spec}


def create_fleet(srv: Server, n: int, schedule: str | None, prefix: str = "b") -> list[tuple[str, str]]:
    names = []
    for i in range(NAMESPACES):
        ns = f"team-{i}"
        try:
            srv.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            srv.call("POST", f"/api/v1/namespaces/{ns}/secrets", {"apiVersion": "v1", "kind": "Secret",
                     "metadata": {"name": "rmq"}, "stringData": {"username": "u", "password": "p"}})
        except urllib.error.HTTPError as e:
            if e.code != 409:
                raise
    for i in range(n):
        ns, name = f"team-{i % NAMESPACES}", f"{prefix}-{i}"
        srv.call("POST", f"/apis/rbak.io/v1alpha1/namespaces/{ns}/rabbitmqbackups", backup_body(name, ns, schedule))
        names.append((ns, name))
    return names


class OperatorProc:
    def __init__(self, srv: Server, mode: str, log: Path, extra_env: dict[str, str] | None = None) -> None:
        env = {**os.environ, **(extra_env or {}), "KUBECONFIG": str(srv.kube.kubeconfig),
               "PYTHONPATH": os.pathsep.join([str(OPERATOR_DIRS[mode]), str(OPERATOR_DIRS[mode].parent)]),
               "RBAK_OPERATOR_STANDALONE": "1", "RBAK_METRICS_PORT": "0",
               "RBAK_IMAGE": "rbak:bench", "RBAK_OPERATOR_LOG_LEVEL": "WARNING"}
        for k in ("RBAK_OPERATOR_CLOCK_FILE", "RBAK_OPERATOR_TICK_SECONDS", "RBAK_OPERATOR_NOW_OFFSET"):
            env.pop(k, None)
        self.log = open(log, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "rbak_operator"], env=env, cwd=OPERATOR_DIRS[mode].parent,
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def wait_until(pred, timeout: float, what: str, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def far_daily_schedule() -> str:
    t = datetime.now(timezone.utc) + timedelta(hours=12)
    return f"{t.minute} {t.hour} * * *"


def idle(mode: str, n: int, window: float, work: Path) -> dict:
    srv = Server(work / f"idle-{mode}-{n}")
    op = None
    try:
        create_fleet(srv, n, far_daily_schedule())
        op = OperatorProc(srv, mode, work / f"idle-{mode}-{n}.log")
        wait_until(lambda: all((b.get("status") or {}).get("nextScheduleTime") for b in srv.backups()),
                   max(120, n * 0.5), f"{n} objects scheduled", every=2)
        time.sleep(10)  # the passes caused by the first passes' own status patches
        srv.mark()
        cpu0, t0 = op.cpu_seconds(), time.monotonic()
        time.sleep(window)
        elapsed = time.monotonic() - t0
        reqs = srv.operator_requests()
        per_hour = reqs / n / (elapsed / 3600)
        resync = RESYNC_REQUESTS / RESYNC_HOURS if mode != "poll" else 0.0  # the 10 s loop had no resync
        return {"requests": reqs, "window_s": round(elapsed), "per_object_hour": per_hour + resync,
                "rss_mib": op.rss_mib(), "cpu_pct": 100 * (op.cpu_seconds() - cpu0) / elapsed}
    finally:
        if op:
            op.stop()
        srv.stop()


def latency(mode: str, runs: int, work: Path, fleet: int = 100) -> dict:
    srv = Server(work / f"latency-{mode}")
    op = None
    try:
        names = create_fleet(srv, fleet, far_daily_schedule())
        op = OperatorProc(srv, mode, work / f"latency-{mode}.log")
        wait_until(lambda: all((b.get("status") or {}).get("nextScheduleTime") for b in srv.backups()),
                   max(120, fleet * 0.5), "objects scheduled", every=2)
        out = []
        for i in range(runs):
            ns, name = names[i]
            srv.call("PATCH", f"/apis/rbak.io/v1alpha1/namespaces/{ns}/rabbitmqbackups/{name}",
                     {"metadata": {"annotations": {"rbak.io/backup-now": f"lat-{i}"}}}, "application/merge-patch+json")
            job = manual_run_name(name, f"lat-{i}")

            def job_exists():
                try:
                    return srv.call("GET", f"/apis/batch/v1/namespaces/{ns}/jobs/{job}")
                except urllib.error.HTTPError:
                    return None
            wait_until(job_exists, 60, f"Job {job}", every=0.05)
            now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            t0 = time.monotonic()
            srv.call("PATCH", f"/apis/batch/v1/namespaces/{ns}/jobs/{job}/status",
                     {"status": {"active": 0, "succeeded": 1, "startTime": now, "completionTime": now,
                                 "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": now}]}},
                     "application/merge-patch+json")

            def recorded():
                st = srv.call("GET", f"/apis/rbak.io/v1alpha1/namespaces/{ns}/rabbitmqbackups/{name}").get("status") or {}
                lr = st.get("lastRun") or {}
                return lr.get("jobName") == job and lr.get("phase") == "Succeeded"
            wait_until(recorded, 60, f"{name} status for {job}", every=0.05)
            out.append(time.monotonic() - t0)
        return {"median_s": statistics.median(out), "max_s": max(out), "runs": len(out)}
    finally:
        if op:
            op.stop()
        srv.stop()


def burst(mode: str, n: int, work: Path) -> dict:
    """N objects created with a slot 3 minutes ahead (the same minute for all); an operator restart halfway
    through the burst in the events mode checks 'exactly once'."""
    srv = Server(work / f"burst-{mode}-{n}")
    op = None
    try:
        slot = (datetime.now(timezone.utc) + timedelta(minutes=3)).replace(second=0, microsecond=0)
        create_fleet(srv, n, f"{slot.minute} {slot.hour} * * *")
        op = OperatorProc(srv, mode, work / f"burst-{mode}-{n}.log")
        left = (slot - datetime.now(timezone.utc)).total_seconds()
        if left < 5:
            raise RuntimeError(f"creating {n} objects took too long: the slot {slot:%H:%M} is {left:.0f}s away")
        time.sleep(left)
        t0 = time.monotonic()
        restarted = False
        want = {scheduled_run_name(f"b-{i}", slot) for i in range(n)}

        def all_jobs():
            nonlocal op, restarted
            have = [j["metadata"]["name"] for j in srv.jobs()]
            if not restarted and len(have) >= n // 2:  # kill the operator mid-burst, start a new one
                op.proc.kill()
                op.proc.wait()
                op.log.close()
                op = OperatorProc(srv, mode, work / f"burst-{mode}-{n}-2.log")
                restarted = True
            return have if set(have) >= want else None
        try:
            have = wait_until(all_jobs, 600, f"{n} Jobs", every=1)
        except TimeoutError:
            have = [j["metadata"]["name"] for j in srv.jobs()]
        took = time.monotonic() - t0
        return {"seconds": took, "jobs": len(have), "distinct": len(set(have)), "missing": len(want - set(have)),
                "extra": len(set(have) - want), "restarted": restarted}
    finally:
        if op:
            op.stop()
        srv.stop()


class IdleArchives:
    """N idle archives' storage: every ARCHIVE_TICK_SECS a new tick per archive, complete up to its write
    (what an idle archiver writes); ``behind[name]`` seconds hold one's recoverable-until back."""

    def __init__(self, root: Path, names: list[tuple[str, str]]) -> None:
        self.root, self.names = root, names
        self.seq = 0
        self.behind: dict[str, float] = {}

    def path(self, name: str) -> Path:
        return self.root / "archive" / "archives" / name

    def tick(self) -> None:
        now = int(time.time() * 1000)
        for _, name in self.names:
            gen = f"{name}.20261206T000000.000Z"
            ru = now - 300 - int(1000 * self.behind.get(name, 0))
            t = Tick(name, gen, self.seq, now, now, ru,
                     [TickStream("orders", "events", StreamInfo(first_offset=0, last_offset=99), 1, ru, True)])
            f = self.path(name) / tick_key(gen, self.seq)
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(t.to_json())
        self.seq += 1


def archive_body(name: str, ns: str, drills: bool = False) -> dict:
    body = {"apiVersion": "rbak.io/v1alpha1", "kind": "RabbitMQArchive", "metadata": {"name": name, "namespace": ns},
            "spec": {"broker": {"amqpUrl": f"amqp://{name}.{ns}.svc:5672/", "managementUrl": f"http://{name}.{ns}.svc:15672",
                                "credentialsSecretRef": {"name": "rmq"}},
                     "storage": {"pvc": {"claimName": "archive", "path": f"archives/{name}"}}}}
    if drills:  # a weekly drill (issue 48): between slots its reconciler must cost nothing
        body["spec"]["verify"] = {"restoreDrill": {"schedule": "0 6 * * 1"}}
    return body


def archives(n: int, window: float, work: Path, drills: bool = False) -> dict:
    srv = Server(work / f"archives-{n}")
    op = None
    try:
        create_fleet(srv, 0, None)  # the namespaces and Secrets
        names = [(f"team-{i % NAMESPACES}", f"a-{i}") for i in range(n)]
        store = IdleArchives(work / f"archives-{n}-pvc", names)
        store.tick()
        for ns, name in names:
            srv.call("POST", f"/apis/rbak.io/v1alpha1/namespaces/{ns}/rabbitmqarchives", archive_body(name, ns, drills))
        op = OperatorProc(srv, "events", work / f"archives-{n}.log", {"RBAK_OPERATOR_PVC_ROOT": str(store.root)})
        last = [time.monotonic()]

        def ticking(pred):
            def probe():
                if time.monotonic() - last[0] >= ARCHIVE_TICK_SECS:
                    store.tick()
                    last[0] = time.monotonic()
                return pred()
            return probe

        def archiving() -> bool:
            items = srv.call("GET", "/apis/rbak.io/v1alpha1/rabbitmqarchives")["items"]
            return len(items) == n and all((a.get("status") or {}).get("phase") == "Archiving" for a in items)
        wait_until(ticking(archiving), max(120, n * 0.5), f"{n} archives Archiving", every=1)
        time.sleep(10)
        srv.mark()
        cpu0, t0 = op.cpu_seconds(), time.monotonic()
        wait_until(ticking(lambda: time.monotonic() - t0 >= window), window + 60, "the window", every=0.5)
        elapsed = time.monotonic() - t0
        reqs = srv.operator_requests()
        per_hour = reqs / n / (elapsed / 3600) + ARCHIVE_RESYNC_REQUESTS / RESYNC_HOURS + 3600 / IDLE_WRITE_SECS
        cpu = 100 * (op.cpu_seconds() - cpu0) / elapsed
        # a lag change: archive a-0's next tick is 60 s behind
        ns0, name0 = names[0]
        store.behind[name0] = 60
        store.tick()
        last[0] = t1 = time.monotonic()

        def shown():
            st = srv.call("GET", f"/apis/rbak.io/v1alpha1/namespaces/{ns0}/rabbitmqarchives/{name0}").get("status") or {}
            return (st.get("lagSeconds") or 0) >= 60
        wait_until(ticking(shown), 120, "the lag change in the status", every=0.2)
        return {"requests": reqs, "window_s": round(elapsed), "per_object_hour": per_hour, "rss_mib": op.rss_mib(),
                "cpu_pct": cpu, "lag_shown_s": time.monotonic() - t1}
    finally:
        if op:
            op.stop()
        srv.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--window", type=float, default=120)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--modes", nargs="+", default=["poll", "events"],
                    help="poll: the operator of --baseline-rev (named --baseline-name); events: this checkout's")
    ap.add_argument("--skip", nargs="*", default=[], choices=["idle", "latency", "burst", "archives"])
    ap.add_argument("--archive-drills", action="store_true", help="archives: each with a weekly verify.restoreDrill")
    ap.add_argument("--baseline-rev", default=BASELINE_REV, help="git revision of the former operator")
    ap.add_argument("--baseline-name", default="poll", help="what to call it in the output (another revision "
                    "than the 10 s loop's: e.g. kopf-daemons for c031837)")
    a = ap.parse_args()
    base = a.baseline_name
    a.modes = [base if m == "poll" else m for m in a.modes]
    problem = binaries_problem()
    if problem:
        print(problem)
        return 2
    res: dict = {}
    with tempfile.TemporaryDirectory(prefix="rbak-opscale-") as tmp:
        work = Path(tmp)
        if base in a.modes:
            OPERATOR_DIRS[base] = checkout_baseline(a.baseline_rev, work / "baseline")
        for mode in a.modes:
            if "idle" not in a.skip:
                for n in a.n:
                    r = res[("idle", mode, n)] = idle(mode, n, a.window, work)
                    print(f"idle     {mode:6} N={n:5}: {r['per_object_hour']:8.2f} req/object/hour "
                          f"({r['requests']} in {r['window_s']}s), RSS {r['rss_mib']:.0f} MiB, CPU {r['cpu_pct']:.1f}%",
                          flush=True)
            if "latency" not in a.skip:
                r = res[("latency", mode)] = latency(mode, a.runs, work)
                print(f"latency  {mode:6}: median {r['median_s']:.2f}s, max {r['max_s']:.2f}s over {r['runs']} runs",
                      flush=True)
            if "burst" not in a.skip:
                n = max(a.n)
                r = res[("burst", mode, n)] = burst(mode, n, work)
                print(f"burst    {mode:6} N={n:5}: {r['jobs']} Jobs ({r['missing']} missing, {r['extra']} extra, "
                      f"{r['jobs'] - r['distinct']} duplicate) in {r['seconds']:.1f}s, operator restarted midway: "
                      f"{r['restarted']}", flush=True)
        if "archives" not in a.skip and "events" in a.modes:
            for n in a.n:
                r = res[("archives", n)] = archives(n, a.window, work, a.archive_drills)
                ok = r["per_object_hour"] <= 1 and r["lag_shown_s"] <= 30
                print(f"archives events N={n:5}{' (weekly drills)' if a.archive_drills else ''}: {r['per_object_hour']:.2f} req/object/hour ({r['requests']} in "
                      f"{r['window_s']}s; resync and 3-hourly refresh shares added), RSS {r['rss_mib']:.0f} MiB, CPU {r['cpu_pct']:.1f}%; "
                      f"a 60 s lag shown in {r['lag_shown_s']:.1f}s; target <= 1 and <= 30 s: "
                      f"{'PASS' if ok else 'BELOW'}", flush=True)
    print(f"\nload average: {os.getloadavg()}")
    if base in a.modes and "events" in a.modes:
        for n in a.n:
            if ("idle", base, n) in res:
                p, e = res[("idle", base, n)], res[("idle", "events", n)]
                ok = e["per_object_hour"] <= 1 and (n < 1000 or e["rss_mib"] <= 250) and e["cpu_pct"] < 2
                print(f"idle N={n}: events/{base} requests ratio {e['per_object_hour'] / max(p['per_object_hour'], 1e-9):.4f} "
                      f"({e['per_object_hour']:.2f} vs {p['per_object_hour']:.1f} per object per hour); "
                      f"target <= 1, RSS <= 250 MiB at 1000, CPU < 2%: {'PASS' if ok else 'BELOW'}")
        if ("latency", base) in res:
            p, e = res[("latency", base)], res[("latency", "events")]
            print(f"latency: events/{base} ratio {e['median_s'] / p['median_s']:.3f} ({e['median_s']:.2f}s vs "
                  f"{p['median_s']:.2f}s); target <= 2 s: {'PASS' if e['median_s'] <= 2 else 'BELOW'}")
        n = max(a.n)
        if ("burst", base, n) in res:
            p, e = res[("burst", base, n)], res[("burst", "events", n)]
            ok = e["seconds"] <= 60 and e["missing"] == 0 and e["extra"] == 0
            print(f"burst N={n}: events/{base} time ratio {e['seconds'] / p['seconds']:.3f} ({e['seconds']:.1f}s vs "
                  f"{p['seconds']:.1f}s); target <= 60 s, each slot once: {'PASS' if ok else 'BELOW'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
