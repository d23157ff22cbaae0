"""What the corpora built from Debian's package archive share: where the packages are cached, their
download (`apt-get download`, no Hub) and the files inside a `.deb`, read in Python (nothing of a
package is executed)."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

CACHE_ROOT = Path(os.environ.get("HF_OUTHEADS_CACHE", Path.home() / ".cache" / "hf_outheads"))  # a folder per corpus


def deb_members(deb: bytes):
    """(path, bytes) of the files in a `.deb`'s data archive (an `ar` archive holding `data.tar.*`)."""
    stream, found = io.BytesIO(deb), None
    if stream.read(8) != b"!<arch>\n":
        raise ValueError("not a Debian package (ar archive)")
    while header := stream.read(60):
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        body = stream.read(size)
        stream.read(size % 2)
        if name.startswith("data.tar"):
            found = body
    with tarfile.open(fileobj=io.BytesIO(found)) as archive:
        for member in archive:
            if member.isfile():
                yield member.name, archive.extractfile(member).read()


def fetch_packages(cache: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """{package: its `.deb`} for `packages`, each downloaded once with `apt-get download` into `cache`."""
    cache.mkdir(parents=True, exist_ok=True)
    have = {p.name.split("_")[0]: p for p in cache.glob("*.deb")}
    missing = [name for name in packages if name not in have]
    if missing:
        try:
            subprocess.run(["apt-get", "download", *missing], cwd=cache, check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as error:
            detail = getattr(error, "stderr", "") or error
            raise RuntimeError(f"Could not download {missing} with apt-get ({str(detail).strip()[-300:]}). On "
                               f"Debian/Ubuntu run `apt-get update`, or put the .deb files in {cache}.") from None
        have = {p.name.split("_")[0]: p for p in cache.glob("*.deb")}
    return {name: have[name] for name in packages}
