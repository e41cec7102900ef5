"""The project's docs, docstrings and charts cite nothing outside the repository: no
design document of the steering repository (PROTOCOLS.md, OWNERSHIP.md...), and every
``docs/*.md`` a file names exists."""

from __future__ import annotations

import re
from pathlib import Path

from fleet.testing.binaries import REPO_ROOT

OUTSIDE = re.compile(r"PROTOCOLS\.md|OWNERSHIP\.md|ARCHITECTURE\.md|STYLE\.md|shared/design")
DOC_REF = re.compile(r"\bdocs/([\w.-]+\.md)\b")
# The contributors' conventions for the sessions working on the project (not user docs).
EXEMPT = {Path("docs/CONTRIBUTING-helpers.md"), Path("tests/unit/test_docs_references.py")}


def project_files() -> list[Path]:
    out = [REPO_ROOT / "README.md"]
    for top, pattern in (("docs", "*.md"), ("bench", "*.md"), ("fleet", "*.py"),
                         ("tests", "*.py"), ("charts", "*"), ("config", "*.yaml")):
        out += [p for p in (REPO_ROOT / top).rglob(pattern) if p.is_file()]
    return [p for p in out if p.relative_to(REPO_ROOT) not in EXEMPT]


def test_nothing_cites_a_document_outside_the_repository() -> None:
    found = []
    for path in project_files():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(REPO_ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_every_docs_page_cited_exists() -> None:
    missing = []
    for path in project_files():
        for name in DOC_REF.findall(path.read_text(errors="replace")):
            if not (REPO_ROOT / "docs" / name).is_file():
                missing.append(f"{path.relative_to(REPO_ROOT)}: docs/{name}")
    assert not missing, "\n".join(missing)
