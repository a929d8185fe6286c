"""A self-signed certificate for localhost / 127.0.0.1, made with ``cryptography`` (else the ``openssl`` CLI);
tests that need one skip cleanly when neither is there."""

from __future__ import annotations

import datetime
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class SelfSigned:
    cert: Path
    key: Path

    @property
    def cert_pem(self) -> bytes:
        return self.cert.read_bytes()


def self_signed(directory: Path, common_name: str = "localhost") -> SelfSigned:
    """Write ``cert.pem`` / ``key.pem`` valid for localhost and 127.0.0.1 into ``directory``."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    try:
        _with_cryptography(cert, key, common_name)
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor the openssl CLI is available to make a certificate")
        _with_openssl(cert, key, common_name)
    return SelfSigned(cert, key)


def _with_cryptography(cert_path: Path, key_path: Path, common_name: str) -> None:
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    san = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(san, critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _with_openssl(cert_path: Path, key_path: Path, common_name: str) -> None:
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key_path), "-out", str(cert_path), "-days", "1", "-subj", f"/CN={common_name}",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
