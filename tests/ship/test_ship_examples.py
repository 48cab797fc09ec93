"""examples/: valid against the CRDs (schema, CEL rules, no unknown fields), GitOps-safe."""

from __future__ import annotations

import copy
import re

import jsonpatch
import pytest
import yaml

from support.ship import ROOT, crd_problems, k8s_validate, load_crds, manifests, render_chart, tool

EXAMPLES = ROOT / "examples"
EXAMPLE_FILES = sorted(p for p in EXAMPLES.glob("*.yaml") if p.name != "kustomization.yaml")
UP = EXAMPLES / "kind" / "up.sh"


def load(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert len(docs) == 1, f"{path.name}: one object per file"
    return docs[0]


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_example_is_accepted_by_its_crd(path):
    obj = load(path)
    assert obj["kind"] in load_crds()
    assert crd_problems(obj) == []
    assert "namespace" not in obj["metadata"], "the kustomization sets the namespace"


def test_expected_examples_exist():
    by_name = {p.name: load(p) for p in EXAMPLE_FILES}
    nightly = by_name["backup-nightly-s3.yaml"]["spec"]
    assert nightly["schedule"] and nightly["retention"]["keepLast"] and "s3" in nightly["storage"]
    on_demand = by_name["backup-on-demand.yaml"]
    assert "schedule" not in on_demand["spec"]
    assert "rbak.io/backup-now" in on_demand["metadata"]["annotations"]
    restore = by_name["restore-pitr.yaml"]["spec"]
    assert restore["pitr"]["start"] and restore["pitr"]["end"] and restore["vhostMapping"] and restore["queueMapping"]
    archive = by_name["archive-orders-s3.yaml"]
    assert archive["kind"] == "RabbitMQArchive" and archive["spec"]["rpoSeconds"] == 30


def test_the_checker_rejects_what_the_api_server_would():
    """crd_problems is live: a typo, a 6-field cron, two storages and a bad enum are all reported."""
    good = load(EXAMPLES / "backup-nightly-s3.yaml")
    cases = {
        "shedule": lambda o: o["spec"].update(shedule="0 2 * * *"),
        "seconds": lambda o: o["spec"].update(schedule="0 15 2 * * *"),
        "exactly one of storage": lambda o: o["spec"]["storage"].update(pvc={"claimName": "x"}),
        "concurrencyPolicy": lambda o: o["spec"].update(concurrencyPolicy="Sometimes"),
    }
    for needle, mutate in cases.items():
        bad = copy.deepcopy(good)
        mutate(bad)
        problems = crd_problems(bad)
        assert any(needle in p for p in problems), (needle, problems)


def test_kustomization_lists_every_example_once():
    k = yaml.safe_load((EXAMPLES / "kustomization.yaml").read_text())
    assert k["kind"] == "Kustomization" and k["namespace"]
    assert sorted(k["resources"]) == sorted(p.name for p in EXAMPLE_FILES)


def apply_kustomize_patches(base: list[dict], kustomization: dict) -> list[dict]:
    """The two patch forms examples/kind uses: JSON 6902 ops by target, and `$patch: delete`."""
    out = copy.deepcopy(base)
    for entry in kustomization["patches"]:
        patch = yaml.safe_load(entry["patch"])
        if isinstance(patch, dict) and patch.get("$patch") == "delete":
            out = [o for o in out if not (o["kind"] == patch["kind"]
                                          and o["metadata"]["name"] == patch["metadata"]["name"])]
            continue
        target = entry["target"]
        for i, obj in enumerate(out):
            group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
            if obj["kind"] == target["kind"] and group == target.get("group", group):
                out[i] = jsonpatch.apply_patch(obj, patch)
    return out


def test_kind_overlay_points_backups_at_minio_and_stays_valid():
    k = yaml.safe_load((EXAMPLES / "kind" / "kustomization.yaml").read_text())
    assert k["resources"] == ["../"]
    base = [load(EXAMPLES / name) for name in yaml.safe_load((EXAMPLES / "kustomization.yaml").read_text())["resources"]]
    out = apply_kustomize_patches(base, k)
    assert {o["kind"] for o in out} == {"RabbitMQBackup"}, "the restore waits for a backup (up.sh)"
    for obj in out:
        assert crd_problems(obj) == []
        s3 = obj["spec"]["storage"]["s3"]
        assert s3["endpoint"] == "http://minio.minio.svc:9000" and s3["pathStyle"] is True


def test_operator_created_objects_are_owned_and_carry_no_gitops_tracking():
    """Argo CD must neither prune nor adopt the operator's Jobs/ConfigMaps/SparkApplications.

    They are owner-referenced to the RabbitMQBackup (shown as its children, GC'd
    with it) and must not inherit the app's tracking label/annotation from it.
    """
    from rbak_operator.decide import bodies

    owner = load(EXAMPLES / "backup-nightly-s3.yaml")
    owner["metadata"].update(namespace="messaging", uid="8f14e45f-ceea-467f-a0e6-5f1c3e2b9a71")
    owner["metadata"]["labels"] = {"app.kubernetes.io/instance": "rabbitmq-backups", "team": "platform"}
    owner["metadata"]["annotations"] = {"argocd.argoproj.io/tracking-id": "backups:rbak.io/RabbitMQBackup:messaging/nightly"}
    labels = bodies.backup_run_labels("nightly", "schedule")
    made = [
        bodies.configmap_body("nightly-x", "messaging", owner, {"mode": "backup"}, labels),
        bodies.job_body(bodies.JobRun(name="nightly-x", namespace="messaging", owner=owner, spec=owner["spec"],
                        storage=owner["spec"]["storage"], secret_env=[], args=bodies.backup_args(), labels=labels)),
        bodies.spark_application_body(name="nightly-x", namespace="messaging", owner=owner, spark={},
                                      script="restore.py", arguments=[], secret_env=[], config_name=None,
                                      labels=labels),
    ]
    for obj in made:
        meta = obj["metadata"]
        ref = meta["ownerReferences"][0]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "RabbitMQBackup", "nightly", owner["metadata"]["uid"], True)
        assert "app.kubernetes.io/instance" not in meta.get("labels", {}), obj["kind"]
        assert not any(k.startswith("argocd.argoproj.io/") for k in meta.get("annotations", {})), obj["kind"]
        if obj["kind"] != "SparkApplication":
            k8s_validate(obj)


def test_status_is_a_subresource_so_it_never_diffs():
    for kind, crd in load_crds().items():
        assert crd["spec"]["versions"][0]["subresources"].get("status") == {}, kind


# ---- examples/kind/up.sh -------------------------------------------------------------

def test_up_sh_passes_shellcheck():
    shellcheck = tool("shellcheck")
    import subprocess

    proc = subprocess.run([shellcheck, "--severity=style", "--external-sources", str(UP),
                           str(ROOT / "docker" / "rbak-entrypoint")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def heredocs(text: str) -> list[str]:
    return re.findall(r"<<YAML\n(.*?)\nYAML\n", text, flags=re.S)


def substitute(text: str) -> str:
    values = {"NAMESPACE": "messaging", "IMAGE": "rbak:dev", "REPO": "/src/rbak", "TIMEOUT": "600s", "MINIO_IMAGE": "minio/minio:RELEASE.x",
              "RABBITMQ_IMAGE": "rabbitmq:4.0.5-management", "name": "make-bucket"}
    text = re.sub(r"\$\(date \+%s\)", "1763800000", text)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], text)


def test_up_sh_embedded_manifests_are_valid():
    checked = set()
    for block in heredocs(UP.read_text()):
        if "$(printf" in block:  # the pod template with an indented script
            continue
        for obj in yaml.safe_load_all(substitute(block)):
            if obj["apiVersion"].startswith("rbak.io/"):
                assert crd_problems(obj) == [], obj
            elif obj["apiVersion"].startswith("rabbitmq.com/"):
                assert obj["kind"] == "RabbitmqCluster"
            else:
                k8s_validate(obj)
            checked.add(obj["kind"])
    assert {"RabbitMQRestore", "Deployment", "Service", "RabbitmqCluster"} <= checked


def test_up_sh_helm_flags_fit_the_chart():
    import helm_python

    import shlex

    text = UP.read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if "helm upgrade --install" in ln)
    line = line.replace("${IMAGE%:*}", "rbak").replace("${IMAGE##*:}", "dev")
    words = [substitute(w) for w in shlex.split(line)]
    values: dict = {}
    for flag, expr in zip(words, words[1:]):
        if flag not in ("--set", "--set-json"):
            continue
        parsed = helm_python.parse_set_json(expr) if flag == "--set-json" else helm_python.parse_set_string(expr)
        for key, val in parsed.items():
            if isinstance(val, dict):
                values.setdefault(key, {}).update(val)
            else:
                values[key] = val
    assert values["image"] == {"repository": "rbak", "tag": "dev", "pullPolicy": "Never"}
    assert values["watchNamespaces"] == ["messaging"]
    objs = manifests(render_chart(values))  # validates against values.schema.json too
    dep = next(o for o in objs if o["kind"] == "Deployment")
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "rbak:dev"


def test_continuous_archiving_docs_show_the_example_that_applies():
    """docs/operator.md and the chart README show docs/examples/rabbitmqarchive-s3.yaml as it is (the
    real-k8s checks apply that file), and the restore of an archive the same way."""
    archive = (ROOT / "docs" / "examples" / "rabbitmqarchive-s3.yaml").read_text().rstrip()
    restore = (ROOT / "docs" / "examples" / "rabbitmqrestore-archive.yaml").read_text().rstrip()
    for doc in ("docs/operator.md", "charts/rbak/README.md"):
        text = (ROOT / doc).read_text()
        section = text[text.index("## Continuous archiving\n"):]
        section = section[:section.index("\n## ", 5)]
        assert f"```yaml\n{archive}\n```" in section, doc
    assert f"```yaml\n{restore}\n```" in (ROOT / "docs" / "operator.md").read_text()
    taps = (ROOT / "docs" / "examples" / "rabbitmqarchive-taps.yaml").read_text().rstrip()
    assert f"```yaml\n{taps}\n```" in (ROOT / "docs" / "operator.md").read_text()
    assert crd_problems(load(ROOT / "docs" / "examples" / "rabbitmqarchive-taps.yaml")) == []
    assert crd_problems(load(ROOT / "docs" / "examples" / "rabbitmqarchive-s3.yaml")) == []
    assert crd_problems(load(ROOT / "docs" / "examples" / "rabbitmqrestore-archive.yaml")) == []
