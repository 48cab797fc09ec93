"""CRD schema of ``RabbitMQBackup.spec.verify`` (restore drills) and ``status.restoreDrill``.

Kept apart from ``crds.py`` (already long); ``crds.backup_crd`` places them.
"""

from __future__ import annotations

from typing import Any

from rbak_operator.crds.parts import CRON_MESSAGE, CRON_RE, _b, _i, _obj, _s, _strlist, broker_schema


def verify_schema() -> dict[str, Any]:
    cron = _s(CRON_MESSAGE.replace("must be", "is") + " (the drill's own schedule)", minLength=1, maxLength=128,
              **{"x-kubernetes-validations": [{"rule": f"self.matches('{CRON_RE}')", "message": CRON_MESSAGE}]})
    drill = _obj(
        "Restore drills: on their own schedule, restore the newest complete backup into a scratch vhost on the "
        "target, compare per-queue message counts and record hashes with the backup, delete the scratch vhost, "
        "and record the result in status.restoreDrill, an event and the metrics. Never touches the source vhosts.",
        {
            "enabled": _b("run drills on the schedule", default=True),
            "schedule": cron,
            "target": broker_schema("Broker the scratch vhost is created on (default: spec.broker). Its user needs "
                                    "the administrator tag (it creates and deletes a vhost)."),
            "readTimeoutSeconds": _i("reading a scratch queue back stops after this long without a message",
                                     minimum=1, maximum=3600),
            "startingDeadlineSeconds": _i("a drill slot missed by more than this is skipped", minimum=0),
            "activeDeadlineSeconds": _i("kill a drill Job after this many seconds", minimum=1),
            "signingKeySecretRef": _obj(
                "Ed25519 private key (PEM) that signs each drill report (rbak drill verify checks it)",
                {"name": _s("Secret in the object's namespace", minLength=1),
                 "key": _s("key in the Secret holding the PEM", default="signing.pem", minLength=1)},
                ["name"],
            ),
        },
        ["schedule"],
    )
    return _obj("Checks beyond validation", {"restoreDrill": drill})


def restore_drill_status_schema() -> dict[str, Any]:
    return _obj(
        "The last restore drill (spec.verify.restoreDrill)",
        {
            "result": _s("outcome of the last drill", enum=["Passed", "Failed", "Skipped"]),
            "reason": _s("DrillPassed, DrillFailed, NoBackup, InvalidSpec, DrillEvidenceInvalid (the signed "
                         "report does not verify, at the drill or on a later check), DrillEvidenceMissing (it "
                         "was removed from the storage) or the Job's failure reason"),
            "message": _s("details: the first queue that did not match, or the Job's error"),
            "backupId": _s("backup drilled"),
            "lastJob": _s("Job of the last recorded drill"),
            "lastRunTime": _s("end of the last drill", format="date-time"),
            "durationSeconds": {"type": "number", "description": "wall time of the last drill"},
            "scratchVhost": _s("the scratch vhost it used (deleted)"),
            "queues": _i("queues compared"),
            "messages": _i("messages restored and read back"),
            "failedQueues": _strlist("queues that did not match, 'vhost/name'"),
            "active": _s("drill Job running now"),
            "lastScheduleTime": _s("last drill slot acted on", format="date-time"),
            "nextRunTime": _s("next drill slot", format="date-time"),
            "recordedJobs": _strlist("drill Jobs already recorded (newest last)"),
            "lastManualTrigger": _s("value of the rbak.io/drill-now annotation last run"),
            "signer": _s("SHA256:<hex> fingerprint of the key that signed the last drill report, shown only "
                         "while the stored report verifies"),
            "evidenceCheckTime": _s("when the operator last verified the stored signed report again (hourly; "
                                    "RBAK_OPERATOR_EVIDENCE_RECHECK_SECONDS)", format="date-time"),
        },
    )
