"""Paths of the TLS material .ci/setup generates (the rmq310 listeners 5671/15671 use it)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TLS_DIR = Path(os.environ.get("RBAK_CI_TLS_DIR", "/var/lib/rbak-ci/tls"))


@dataclass(frozen=True)
class TlsFiles:
    dir: Path
    ca_cert: Path  # CA that signed server and client certs; the broker trusts it
    ca_key: Path
    server_cert: Path  # CN=localhost, SAN localhost, 127.0.0.1, the hostname
    server_key: Path
    client_cert: Path  # CN=guest, signed by ca_cert: the broker accepts it
    client_key: Path
    wrong_ca_cert: Path  # an unrelated CA: verifying the server with it must fail
    wrong_ca_key: Path
    wrong_client_cert: Path  # CN=guest, signed by wrong_ca: the broker rejects it
    wrong_client_key: Path

    def missing(self) -> list[Path]:
        return [p for p in vars(self).values() if isinstance(p, Path) and p != self.dir and not p.is_file()]


def tls_files(directory: Path | str | None = None) -> TlsFiles:
    d = Path(directory) if directory else TLS_DIR
    return TlsFiles(
        dir=d,
        ca_cert=d / "ca.pem", ca_key=d / "ca.key",
        server_cert=d / "server.pem", server_key=d / "server.key",
        client_cert=d / "client.pem", client_key=d / "client.key",
        wrong_ca_cert=d / "wrong-ca.pem", wrong_ca_key=d / "wrong-ca.key",
        wrong_client_cert=d / "wrong-client.pem", wrong_client_key=d / "wrong-client.key",
    )
