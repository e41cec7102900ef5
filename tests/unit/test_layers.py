"""Layering rules, checked on the source (kopf-style import contracts, without a plug-in).

- Only fleet.kube talks to kubernetes_asyncio.
- Pure decision modules import no I/O: not the client layer (its resource descriptors are
  plain data and allowed), not aiohttp, not kubernetes_asyncio, not subprocess/socket.
- Nothing in production code imports the test world.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "fleet"

PURE = [
    "versions.py", "signal.py", "nodeplan.py", "model.py", "eligibility.py", "budget.py",
    "schedule.py", "config.py", "planner", "agents/state.py", "rollout/gate.py",
    "rollout/state.py", "rollout/progress.py", "extension/canupdate.py",
    "extension/patches.py", "extension/wire.py", "extension/progress.py",
    "extension/activation.py", "status/model.py", "intent.py", "rollout/hookgate.py",
]
IO_MODULES = ("aiohttp", "kubernetes_asyncio", "subprocess", "socket", "fleet.kube.client",
              "fleet.kube.patch", "fleet.kube.watch", "fleet.clusters", "fleet.controllers")


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def files(entry: str) -> list[Path]:
    p = ROOT / entry
    return sorted(p.rglob("*.py")) if p.is_dir() else [p]


def _matches(name: str, banned: str) -> bool:
    return name == banned or name.startswith(banned + ".")


@pytest.mark.parametrize("entry", PURE)
def test_pure_modules_do_no_io(entry: str) -> None:
    for f in files(entry):
        bad = sorted(n for n in imports(f) for b in IO_MODULES if _matches(n, b))
        bad += sorted(n for n in imports(f) if n == "fleet.kube")
        assert not bad, f"{f.relative_to(ROOT.parent)} imports I/O: {bad}"


def test_only_the_client_layer_uses_kubernetes_asyncio() -> None:
    offenders = [
        str(f.relative_to(ROOT.parent)) for f in ROOT.rglob("*.py")
        if "kube" not in f.relative_to(ROOT).parts[:1]
        and any(_matches(n, "kubernetes_asyncio") for n in imports(f))
    ]
    assert offenders == []


def test_production_code_does_not_import_the_test_world() -> None:
    allowed = {"testing", "demo.py"}
    offenders = [
        str(f.relative_to(ROOT.parent)) for f in ROOT.rglob("*.py")
        if f.relative_to(ROOT).parts[0] not in allowed
        and any(_matches(n, "fleet.testing") for n in imports(f))
    ]
    assert offenders == []
