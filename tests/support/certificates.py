"""Certificate authorities and server certificates for the TLS tests, made with ``openssl``.

Short-lived (two days) RSA keys without a passphrase, written into a folder of the test's own.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def openssl(*args: str, cwd: Path) -> None:
    """Run ``openssl ARGS`` in ``cwd``; raise ``CalledProcessError`` when it fails."""
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(folder: Path, name: str) -> Path:
    """A self-signed CA ``<name>.crt`` with its key ``<name>.key``; returns the certificate."""
    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.crt",
        cwd=folder,
    )  # fmt: skip
    return folder / f"{name}.crt"


def make_server_certificate(
    folder: Path, ca: str, *, names: str = "IP:127.0.0.1, DNS:localhost", common_name: str = ""
) -> tuple[Path, Path]:
    """``server.crt``/``server.key`` for the subject alternative ``names``, signed by ``ca``.

    Returns the certificate and key paths. ``common_name`` defaults to the first name.
    """
    (folder / "san.ext").write_text(f"subjectAltName = {names}\n")
    subject = common_name or names.split(",", maxsplit=1)[0].split(":", 1)[1].strip()
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={subject}",
        "-keyout", "server.key", "-out", "server.csr",
        cwd=folder,
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", "server.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "server.crt",
        cwd=folder,
    )  # fmt: skip
    return folder / "server.crt", folder / "server.key"
