"""Download one sdist from PyPI's simple index and check its sha256.

    python3 workers/fetch_sdist.py llama-cpp-python 0.3.36 DIR   # prints the file path

Standard library only (it runs in bare build images). `pip download
--no-binary :all:` would also prepare the sdist's metadata, which builds its
build backends from source; this only fetches the file. The CA bundle comes
from SSL_CERT_FILE, as for any OpenSSL client.
"""

from __future__ import annotations

import hashlib
import re
import sys
import urllib.request
from pathlib import Path


def fetch(project: str, version: str, folder: Path, index: str = "https://pypi.org/simple") -> Path:
    filename = f"{re.sub(r'[-_.]+', '_', project).lower()}-{version}.tar.gz"
    with urllib.request.urlopen(f"{index}/{project}/", timeout=60) as r:
        page = r.read().decode()
    match = re.search(r'href="([^"#]*/' + re.escape(filename) + r')#sha256=([0-9a-f]{64})"', page)
    if match is None:
        raise SystemExit(f"{filename} is not in {index}/{project}/")
    url, sha256 = match.groups()
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / filename
    with urllib.request.urlopen(url, timeout=300) as r:
        data = r.read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SystemExit(f"{filename}: sha256 mismatch")
    out.write_bytes(data)
    return out


if __name__ == "__main__":
    print(fetch(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
