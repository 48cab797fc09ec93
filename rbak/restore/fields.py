"""The restore's AMQP 0-9-1 property encoder: kept importable from here.

The codec (and its field-type -> variant table) is :mod:`rbak.format.amqp091`,
shared with the online backup and the offline importer.
"""

from ..format.amqp091 import (  # noqa: F401
    decode_basic_properties,
    decode_table,
    encode_basic_properties,
    encode_table,
    header_equal,
)
