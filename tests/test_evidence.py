"""rbak.repo.evidence without a broker: canonical payload, and malformed signatures refused with the member named."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from rbak.errors import EvidenceError
from rbak.repo.evidence import canonical, sign, verify


def test_canonical_is_sorted_compact_utf8_without_the_signature():
    report = {"b": [1, {"z": "ü", "a": 0.5}], "a": True, "signature": {"x": 1}}
    assert canonical(report) == json.dumps({k: v for k, v in report.items() if k != "signature"}, sort_keys=True,
                                           separators=(",", ":"), ensure_ascii=False).encode()


def test_malformed_signatures_are_refused_naming_the_member():
    key = Ed25519PrivateKey.generate()
    good = {"backup_id": "b1", "passed": True}
    sig = sign(good, key)
    cases = [
        ({**sig, "payload": 5}, "signature.payload/value is not base64"),
        ({**sig, "public_key": "junk"}, "signature.public_key is not a PEM public key"),
        ({**sig, "format": "other/2"}, "signature.format/algorithm 'other/2'/'Ed25519' unknown"),
        ({**sig, "payload": base64.b64encode(b"not json").decode(),
          "value": base64.b64encode(key.sign(b"not json")).decode()}, "signature.payload is not JSON"),
        ({**sig, "key_fingerprint": "SHA256:" + "0" * 64}, "signature.public_key does not match"),
    ]
    for bad, needle in cases:
        with pytest.raises(EvidenceError, match="report: " + needle.replace("(", r"\(").replace(")", r"\)")):
            verify({**good, "signature": bad})
    assert verify({**good, "signature": sig}).report == good
    with pytest.raises(EvidenceError, match="not a JSON object"):
        verify([good])
