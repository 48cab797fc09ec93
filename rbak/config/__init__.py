"""The YAML configuration of ``rbak backup`` / ``rbak restore``, as typed dataclasses.

Field names follow the Rust rabbitmq-backup tool where it has them. Every
field carries its documentation in its dataclass metadata, so the README's
configuration reference is generated from it (``python -m rbak.config`` or
``rbak config-reference``) and never drifts from the code.

Loading validates the WHOLE file before anything touches a broker: unknown
keys, wrong types, out-of-range values and missing required fields are all
collected and raised as one ``ConfigError`` that lists each problem with its
key path (``backup.compression_level: must be an integer from 1 to 22, got 'high'``).

``model`` holds ``Config`` and its checks across fields, ``sections`` its parts,
``validation`` builds them from plain data (interpolation, coercion), ``loading``
reads YAML files, ``reference`` generates the docs and schema. This package only
re-exports them; none of them imports it, so there is no import cycle.

Strings may use ``${VAR}`` and ``${VAR:-default}`` (environment variables);
``$${`` is a literal ``${``. Passwords and secret keys never appear in
``repr()``, logs or errors: they are masked as ``***``.
"""

from .fields import MASK, doc_field, mask_url
from .loading import load_config, yaml_error_text
from .model import Config, default_backup_id
from .sections import (
    SCRATCH_VHOST_PREFIX, QueueType, TlsConfig, QueueSelection, queue_selected, ConnectionConfig,
    StorageConfig, BackupOptions, OwnerConfig, DefinitionsSelection, TimeBound, RestoreOptions,
    OffsetStorageConfig, MetricsConfig, EncryptionConfig, ArchiveOptions, DrillConfig,
)
from .reference import config_reference_markdown, iter_fields, json_schema
from .validation import interpolate, parse_time_bound

__all__ = [
    "SCRATCH_VHOST_PREFIX", "QueueType", "TlsConfig", "QueueSelection", "queue_selected", "ConnectionConfig",
    "StorageConfig", "BackupOptions", "OwnerConfig", "DefinitionsSelection", "TimeBound", "RestoreOptions",
    "OffsetStorageConfig", "MetricsConfig", "EncryptionConfig", "ArchiveOptions", "DrillConfig", "Config",
    "default_backup_id", "MASK", "doc_field", "mask_url", "load_config", "yaml_error_text",
    "config_reference_markdown", "iter_fields", "json_schema", "interpolate", "parse_time_bound",
]
