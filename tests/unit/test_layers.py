"""Layering rules, checked on the source (kopf-style import contracts, without a plug-in).

- Floors only point down: the packages and top-level modules of ``fleet`` stand in the
  order of :data:`LAYERS` (top first); a module may import only from floors below its own.
  Units on one floor (separated by ``|``) are independent of each other. Every unit must
  be placed; deferred and TYPE_CHECKING imports count too.
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

LAYERS = [
    "cli",                                            # entry points: compose the process
    "status",                                         # status document, HTTP, metrics
    "extension",                                      # CAPI hooks (ask the rollout's gate)
    "rollout",                                        # waves gate, policy, dry run
    "controllers | agents | testing",                 # the long-running parts
    "dispatch",                                       # create-or-adopt a NodePlan
    "artifacts | clusters | events | listen | telemetry",  # shared I/O services
    "planner | snapshot",                             # pure decisions
    "records | kept",                                 # compact workload / management records
    "eligibility | budget | executors | intent | reported | fence | drainrules",
    "model",
    "nodeplan",
    "config_loader | downloads",
    "config",
    "selectors",
    "config_types",
    "config_errors | schedule | signal | tracecontext | skew",
    "versions",
    "kube",                                           # the only API-server client layer
]
FLOOR = {unit.strip(): n for n, floor in enumerate(LAYERS) for unit in floor.split("|")}

PURE = [
    "versions.py", "signal.py", "nodeplan.py", "model.py", "eligibility.py", "budget.py",
    "executors.py", "records.py", "kept.py",
    "schedule.py", "config.py", "config_types.py", "config_errors.py", "config_loader.py",
    "selectors.py", "downloads.py", "snapshot.py", "planner", "agents/state.py", "rollout/gate.py",
    "rollout/state.py", "rollout/progress.py", "extension/canupdate.py",
    "extension/patches.py", "extension/wire.py", "extension/progress.py",
    "extension/activation.py", "status/model.py", "intent.py", "rollout/hookgate.py",
    "fence.py", "skew.py", "drainrules.py",
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


def unit_of(module: str) -> str:
    """``fleet.controllers.runner`` -> ``controllers``; ``fleet.config`` -> ``config``."""
    return module.split(".")[1] if module.count(".") else ""


def module_of(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def back_imports(root: Path = ROOT) -> list[str]:
    """Every import that points sideways or up, or involves an unplaced unit."""
    problems = []
    for f in sorted(root.rglob("*.py")):
        src = unit_of(module_of(f))
        if not src:
            continue  # fleet/__init__.py
        seen: set[str] = set()
        for name in sorted(n for n in imports(f) if n.startswith("fleet.")):
            dst = unit_of(name)
            if dst == src or not ((root / dst).is_dir() or (root / f"{dst}.py").exists()):
                continue  # within the unit, or a name from fleet/__init__.py
            if dst in seen:
                continue  # one report per (module, unit)
            seen.add(dst)
            where = f"{f.relative_to(ROOT.parent)} imports {name}"
            if src not in FLOOR or dst not in FLOOR:
                problems.append(f"{where}: place {src if src not in FLOOR else dst!r} in LAYERS")
            elif FLOOR[dst] == FLOOR[src]:
                problems.append(f"{where}: {src} and {dst} share a floor and must stay apart")
            elif FLOOR[dst] < FLOOR[src]:
                problems.append(f"{where}: {dst} is above {src}")
    return problems


def test_floors_only_point_down() -> None:
    assert back_imports() == []


def test_every_unit_is_placed_once() -> None:
    units = [u.strip() for floor in LAYERS for u in floor.split("|")]
    assert len(units) == len(set(units))
    present = {unit_of(module_of(f)) for f in ROOT.rglob("*.py")} - {""}
    assert present <= set(units), f"not in LAYERS: {sorted(present - set(units))}"


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
    allowed = {("testing",), ("cli", "demo.py")}
    offenders = [
        str(f.relative_to(ROOT.parent)) for f in ROOT.rglob("*.py")
        if f.relative_to(ROOT).parts[:1] not in allowed
        and f.relative_to(ROOT).parts[:2] not in allowed
        and any(_matches(n, "fleet.testing") for n in imports(f))
    ]
    assert offenders == []
