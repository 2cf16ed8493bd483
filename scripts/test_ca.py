"""Generate the throwaway TLS material of the HTTPS tests (never used outside loopback).

Usage: test_ca.py DIR

Writes into DIR (created, mode 0700):
  ca.pem          a test certificate authority (what SSL_CERT_FILE points at in the tests)
  server.pem      a server certificate for 127.0.0.1, ::1 and localhost, signed by the CA
  server-key.pem  its private key (PKCS#8)
  sa-key.pem      an RSA key for a fake Google service account (PKCS#8)
  other-ca.pem    an unrelated CA that signed nothing (a root the servers do not chain to)
Existing files are replaced. Runs with the emulators' venv (moto brings `cryptography`).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import sys

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def write(path: str, data: bytes, mode: int = 0o600) -> None:
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def pkcs8(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_ca(name: str, start, end):
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, subject, cert


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = argv[0]
    os.makedirs(out, mode=0o700, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=365)

    ca_key, ca_name, ca = make_ca("leader-lease test CA", start, end)
    _, _, other_ca = make_ca("leader-lease unrelated CA", start, end)

    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(
            x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("::1")),
                x509.DNSName("localhost"),
            ]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    write(os.path.join(out, "ca.pem"), ca.public_bytes(serialization.Encoding.PEM), 0o644)
    write(os.path.join(out, "other-ca.pem"), other_ca.public_bytes(serialization.Encoding.PEM), 0o644)
    write(os.path.join(out, "server.pem"), leaf.public_bytes(serialization.Encoding.PEM), 0o644)
    write(os.path.join(out, "server-key.pem"), pkcs8(key))
    write(os.path.join(out, "sa-key.pem"), pkcs8(rsa.generate_private_key(65537, 2048)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
