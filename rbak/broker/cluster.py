"""One broker behind both URLs: the cluster an AMQP connection announces against the one the
Management API names.

``management_url`` defaults to :15672 whatever the AMQP port, so with two brokers on one host a
configuration easily reads one broker's API and the other's queues. A backup split this way listed
queues on one broker and found none of them on the other (a "complete" empty backup); a restore
checked limits on one broker and published into another. Both refuse it before anything is written,
with the message built here.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..config import ConnectionConfig, mask_url
from ..errors import AmqpAuthenticationError
from .connect import connect


def amqp_cluster_name(server_properties: dict[str, Any] | None) -> str | None:
    """The ``cluster_name`` the broker announced in the AMQP handshake (None when it did not)."""
    raw = (server_properties or {}).get("cluster_name")
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw


def split_cluster(role: str, conn: ConnectionConfig, amqp_cluster: str | None, mgmt_cluster: str | None,
                  flag: str = "") -> str | None:
    """The one line naming both URLs and both clusters when ``role.management_url`` answers for
    another cluster than ``role.amqp_url`` (``role``: the config section: ``source``, ``target``,
    ``drill.target``; ``flag``: the command-line option that sets the management URL, if any);
    None when they agree or either name is unknown (the steps that need that side name what failed)."""
    if not amqp_cluster or not mgmt_cluster or amqp_cluster == mgmt_cluster:
        return None
    flag = f" ({flag})" if flag else ""
    return (f"{role}.management_url {mask_url(conn.management_url)} answers for cluster {mgmt_cluster!r}, but "
            f"{role}.amqp_url {conn.safe_amqp_url} is cluster {amqp_cluster!r}: point {role}.management_url{flag} "
            f"at the broker {role}.amqp_url names")


def split_broker(role: str, conn: ConnectionConfig, mgmt_cluster: str | None, vhosts: Iterable[str] = ()) -> str | None:
    """``split_cluster`` for a configuration whose AMQP side is rbak's 0-9-1 connection (backup, archive,
    drill): the first of ``vhosts``, the URL's vhost, then ``/`` that opens tells the AMQP side's cluster.
    None opening (refused logins) leaves it to the steps that need them, which name what failed; a port
    that cannot be reached or does not speak AMQP fails here, at once, with that connection's error."""
    for vhost in dict.fromkeys([*vhosts, conn.url_vhost, "/"]):
        try:
            c = connect(conn, vhost, role)
        except AmqpAuthenticationError:
            continue  # this vhost refused (or the login did: the steps that need it say so)
        try:
            amqp_cluster = amqp_cluster_name(c.server_properties)
        finally:
            c.close()
        return split_cluster(role, conn, amqp_cluster, mgmt_cluster)
    return None
