"""Every command the operator puts into a pod is one the image provides.

The Job and SparkApplication bodies come from the operator's own pure
builders (``rbak_operator.decide.bodies``); their commands are checked against the
Dockerfile (what is installed where) and their arguments are parsed by the real
argparse parsers of the programs the image runs.
"""

from __future__ import annotations

import ast

import pytest

from support.dockerfile import parse
from support.ship import ROOT, find, manifests, render_chart

OWNER = {"apiVersion": "rbak.io/v1alpha1", "kind": "RabbitMQBackup",
         "metadata": {"name": "nightly", "namespace": "messaging", "uid": "0b7a2c8e-1111-2222-3333-444455556666"}}
S3 = {"s3": {"bucket": "rabbitmq-backups", "prefix": "prod", "region": "eu-west-1",
             "credentialsSecretRef": {"name": "rbak-s3"}}}


def job_bodies() -> dict[str, dict]:
    from rbak_operator.decide import bodies, rbakconfig

    url = rbakconfig.storage_url(S3)
    common = dict(namespace="messaging", owner=OWNER, spec={}, storage=S3, secret_env=[],
                  labels=bodies.backup_run_labels("nightly", "schedule"))
    return {
        "backup+validate": bodies.job_body(bodies.JobRun(name="nightly-20260101-0200", args=bodies.backup_args(),
                                           validate_args=bodies.validate_args(url, "nightly-20260101-0200", True),
                                           **common)),
        "backup": bodies.job_body(bodies.JobRun(name="nightly-manual-1", args=bodies.backup_args(), **common)),
        "restore": bodies.job_body(bodies.JobRun(name="r-restore", args=bodies.restore_args(), **common)),
    }


def containers(job: dict) -> list[dict]:
    pod = job["spec"]["template"]["spec"]
    return pod.get("initContainers", []) + pod["containers"]


def rbak_parser():
    from rbak.cli import build_parser

    return build_parser()


def parse_or_fail(parse, args: list[str], what: str):
    """argparse exits on bad input; turn that into a failure naming the command line."""
    try:
        return parse(args)
    except SystemExit as e:
        pytest.fail(f"{what} does not accept {args!r} (argparse exit {e.code}); see captured stderr", pytrace=False)


@pytest.mark.parametrize("kind", ["backup+validate", "backup", "restore"])
def test_job_commands_are_rbak_cli_invocations_the_image_runs(kind):
    parser = rbak_parser()
    for c in containers(job_bodies()[kind]):
        assert c["command"] == ["python", "-m", "rbak"], c["command"]
        # `python -m rbak` needs rbak/__main__.py, installed by the image's `pip install .`
        assert (ROOT / "rbak" / "__main__.py").is_file()
        args = parse_or_fail(parser.parse_args, c["args"], "rbak")
        assert callable(args.handler)
        assert args.command == c["args"][0]


def test_job_pods_run_as_the_image_user_with_writable_state():
    df = parse(ROOT / "Dockerfile")
    uid, _, _ = df.effective("runtime", "USER").value.partition(":")
    from rbak_operator.decide import rbakconfig

    for job in job_bodies().values():
        pod = job["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsUser"] == int(uid), "Job pods and the image disagree on the UID"
        for c in containers(job):
            if c["securityContext"].get("readOnlyRootFilesystem"):
                writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
                assert rbakconfig.STATE_DIR in writable
                env = {e["name"]: e.get("value") for e in c["env"]}
                assert env[rbakconfig.ENV_STATE] == rbakconfig.STATE_DIR


def test_job_image_is_the_one_the_chart_configures():
    """The operator's default Job image comes from RBAK_IMAGE, which the chart sets to its image."""
    import importlib
    import os

    objs = manifests(render_chart({"image": {"repository": "registry.example.com/rbak", "tag": "1.2.3"}}))
    env = {e["name"]: e.get("value") for e in
           find(objs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    from rbak_operator.decide import bodies

    old = os.environ.get("RBAK_IMAGE")
    os.environ["RBAK_IMAGE"] = env["RBAK_IMAGE"]
    try:
        fresh = importlib.reload(bodies)
        job = fresh.job_body(fresh.JobRun(name="x", namespace="n", owner=OWNER, spec={}, storage=S3, secret_env=[],
                             args=fresh.backup_args(), labels={}))
        assert containers(job)[0]["image"] == "registry.example.com/rbak:1.2.3"
    finally:
        if old is None:
            os.environ.pop("RBAK_IMAGE", None)
        else:
            os.environ["RBAK_IMAGE"] = old
        importlib.reload(bodies)


def test_operator_deployment_command_is_the_operator_module():
    """args ["operator"] -> the entrypoint's operator role -> `python -m rbak_operator`."""
    dep = find(manifests(render_chart({})), "Deployment")[0]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in c, "the Deployment must go through the image's entrypoint"
    df = parse(ROOT / "Dockerfile")
    assert df.effective("runtime", "ENTRYPOINT").value == '["rbak-entrypoint"]'
    script = (ROOT / "docker" / "rbak-entrypoint").read_text()
    assert c["args"][0] == "operator" and "exec python -m rbak_operator" in script
    assert (ROOT / "operator" / "rbak_operator" / "__main__.py").is_file()


def literal_args(elts: list[ast.expr]) -> list[str]:
    """Flags as written, expressions as placeholders; `*([...] if cond else [])` taken with cond true."""
    out: list[str] = []
    for e in elts:
        if isinstance(e, ast.Starred):
            inner = e.value.body if isinstance(e.value, ast.IfExp) else e.value
            assert isinstance(inner, (ast.List, ast.Tuple)), f"cannot read starred argument {ast.unparse(e)}"
            out += literal_args(inner.elts)
        elif isinstance(e, ast.Constant):
            out.append(e.value)
        else:
            out.append(f"placeholder-{len(out)}")
    return out


def spark_restore_arguments() -> list[list[str]]:
    """The `arguments` the operator's handlers pass to spark_application_body, read from its source.

    They are built inline in the reconcilers (not in a pure builder), so read the
    list literal assigned to the name passed as arguments=; expressions become
    placeholder values, flags stay as written.
    """
    trees = [ast.parse(p.read_text()) for p in sorted((ROOT / "operator" / "rbak_operator").rglob("*.py"))]
    found = []
    for fn in (node for tree in trees for node in ast.walk(tree)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        assigns = {t.id: node.value for node in ast.walk(fn) if isinstance(node, ast.Assign)
                   for t in node.targets if isinstance(t, ast.Name)}
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "spark_application_body"):
                continue
            kw = {k.arg: k.value for k in call.keywords}
            script = ast.literal_eval(kw["script"])
            value = kw["arguments"]
            if isinstance(value, ast.Name):
                value = assigns[value.id]
            assert isinstance(value, ast.List), "arguments must be a list literal to be checked"
            found.append((script, literal_args(value.elts)))
    assert {script for script, _ in found} >= {"restore.py", "validate.py"}, found
    return found


def test_spark_application_scripts_exist_in_the_spark_image_and_accept_the_arguments():
    from rbak_operator.decide import bodies

    df = parse(ROOT / "Dockerfile")
    assert f"spark/ {bodies.SPARK_FILES}/" in [i.value for i in df.stages["spark"].all("COPY")]
    parsers = {}
    from rbak_spark import restore_job, validate_job
    parsers["restore.py"], parsers["validate.py"] = restore_job.parse_args, validate_job.parse_args
    for script, args in spark_restore_arguments():
        assert (ROOT / "spark" / script).is_file(), script
        body = bodies.spark_application_body(name="r", namespace="n", owner=OWNER, spark={}, script=script,
                                             arguments=args, secret_env=[], config_name="r", labels={})
        assert body["spec"]["mainApplicationFile"] == f"local://{bodies.SPARK_FILES}/{script}"
        assert body["spec"]["type"] == "Python"
        parse_or_fail(parsers[script], body["spec"]["arguments"], f"spark/{script}")


def test_spark_applications_run_the_spark_image_the_chart_configures():
    """SparkApplications need Java: the chart hands the operator the spark target's tag."""
    import importlib
    import os

    cases = {
        "tag": ({"image": {"repository": "registry.example.com/rbak", "tag": "1.2.3"}},
                "registry.example.com/rbak:1.2.3-spark"),
        "digest": ({"image": {"repository": "registry.example.com/rbak", "digest": "sha256:" + "cd" * 32}},
                   "registry.example.com/rbak:0.1.0-spark"),
        "explicit": ({"spark": {"image": "registry.example.com/rbak-spark@sha256:" + "ef" * 32}},
                     "registry.example.com/rbak-spark@sha256:" + "ef" * 32),
    }
    from rbak_operator.decide import bodies

    saved = {k: os.environ.get(k) for k in ("RBAK_IMAGE", "RBAK_SPARK_IMAGE")}
    try:
        for name, (values, want) in cases.items():
            objs = manifests(render_chart(values))
            env = {e["name"]: e.get("value") for e in
                   find(objs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
            os.environ["RBAK_IMAGE"], os.environ["RBAK_SPARK_IMAGE"] = env["RBAK_IMAGE"], env["RBAK_SPARK_IMAGE"]
            fresh = importlib.reload(bodies)
            app = fresh.spark_application_body(name="r", namespace="n", owner=OWNER, spark={}, script="restore.py",
                                               arguments=[], secret_env=[], config_name=None, labels={})
            assert app["spec"]["image"] == want, name
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        importlib.reload(bodies)
