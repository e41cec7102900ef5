"""Reading the Dockerfile."""

from __future__ import annotations

import re

from fleet.testing.binaries import REPO_ROOT

DOCKERFILE = (REPO_ROOT / "Dockerfile").read_text()


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out
