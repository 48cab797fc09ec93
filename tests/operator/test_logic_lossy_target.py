"""RabbitMQRestore ``spec.allowLossyTarget`` reaches the restore's config (issue 27)."""

from __future__ import annotations

from rbak.config import Config
from rbak.restore.options import options_from_config
from rbak_operator.decide import rbakconfig
from support.operator_specs import CLUSTER_SPEC, SECRET_ENV


def test_allow_lossy_target_is_off_unless_asked():
    for spec, want in (({}, False), ({"allowLossyTarget": False}, False), ({"allowLossyTarget": True}, True)):
        cfg, _ = rbakconfig.restore_config(spec, "prod", "b", CLUSTER_SPEC["broker"], CLUSTER_SPEC["storage"])
        loaded = Config.from_dict(cfg, env=SECRET_ENV)
        assert loaded.restore.allow_lossy_target is want
        assert options_from_config(loaded).allow_lossy_target is want
