"""Layering rules, checked on the source (kopf-style import contracts, without a plug-in).

- Floors only point down: the packages and top-level modules of ``fleet`` stand in the
  order of :data:`LAYERS` (top first); a module may import only from floors below its own.
  Units on one floor (separated by ``|``) are independent of each other. Every unit must
  be placed; deferred and TYPE_CHECKING imports count too. The packages that name the
  architecture (``world``, ``config``, ``contract``) keep the same rule inside
  (:data:`SUBLAYERS`).
- The node agent's process loads only the wire contract (``fleet.contract``), the client
  layer and the tracing set-up, followed through every import (:data:`AGENT_MAY_IMPORT`).
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
    "artifacts | events | listen | telemetry",        # shared I/O services
    "planner",                                        # pure decisions: snapshot -> actions
    "world",                                          # the controller's view of the world
    "config",                                         # the fleet YAML: models, loader
    "contract",                                       # the wire contract (controller, agent)
    "kube",                                           # the only API-server client layer
]
FLOOR = {unit.strip(): n for n, floor in enumerate(LAYERS) for unit in floor.split("|")}

# Floors inside the packages that name the architecture: the same rule, one level down
# (``fleet.world.snapshot`` may import ``fleet.world.model``, not the other way).
SUBLAYERS = {
    "world": [
        "clusters | snapshot",                        # workload clients | raw -> snapshot
        "records | kept",                             # compact workload / management records
        "eligibility | budget | executors | intent | reported | fence | drainrules",
        "model | delta",                              # the immutable snapshot types | what moved
    ],
    "config": [
        "loader | downloads",                         # flags > env > YAML | URL + digest
        "models",                                     # the configuration models
        "types",                                      # durations, budgets, URL templates
        "errors | schedule",                          # one-line problems | cron windows
    ],
    "contract": [
        "nodeplan",                                   # NodePlan naming and body
        "selectors",                                  # label selectors (config, drain rules)
        "signal | skew | kubenames | problems | tracecontext",
        "versions",                                   # k0s version normalisation
    ],
}

# What the node agent may import of fleet: the wire contract and the client layer. This is
# what keeps it light (docs/agent.md); the floors alone would let it reach config or world.
AGENT_MAY_IMPORT = ("fleet.agents", "fleet.contract", "fleet.kube",
                    "fleet.cli.agent", "fleet.cli.exit",  # the command and its exit codes
                    "fleet.telemetry")  # the OTel SDK set-up, loaded only to export traces

PURE = [
    "contract/versions.py", "contract/signal.py", "contract/nodeplan.py",
    "contract/skew.py", "contract/selectors.py", "contract/kubenames.py",
    "contract/problems.py", "config", "world/model.py", "world/eligibility.py",
    "world/budget.py", "world/executors.py", "world/records.py", "world/kept.py",
    "world/snapshot.py", "world/intent.py", "world/fence.py", "world/drainrules.py",
    "world/reported.py", "planner", "agents/state.py", "rollout/gate.py",
    "rollout/state.py", "rollout/progress.py", "extension/canupdate.py",
    "extension/patches.py", "extension/wire.py", "extension/progress.py",
    "extension/activation.py", "status/model.py", "rollout/hookgate.py",
]
IO_MODULES = ("aiohttp", "kubernetes_asyncio", "subprocess", "socket", "fleet.kube.client",
              "fleet.kube.patch", "fleet.kube.watch", "fleet.world.clusters", "fleet.controllers")


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


def unit_of(module: str, package: str = "fleet") -> str:
    """``fleet.controllers.runner`` -> ``controllers``; ``fleet.config.models`` -> ``config``;
    within ``fleet.world``: ``fleet.world.model`` -> ``model``. Outside the package: ''."""
    if not module.startswith(package + "."):
        return ""
    return module.removeprefix(package + ".").split(".")[0]


def module_of(path: Path) -> str:
    top = next(d for d in path.parents if d.name == "fleet")  # the tree path belongs to
    rel = path.relative_to(top.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def floors(layers: list[str]) -> dict[str, int]:
    return {unit.strip(): n for n, floor in enumerate(layers) for unit in floor.split("|")}


def back_imports(root: Path = ROOT, layers: list[str] = LAYERS) -> list[str]:
    """Every import that points sideways or up, or involves an unplaced unit, among the
    units of the package at ``root`` (``fleet``, or one of its packages)."""
    package = module_of(root / "__init__.py")
    floor = floors(layers)
    problems = []
    for f in sorted(root.rglob("*.py")):
        src = unit_of(module_of(f), package)
        if not src:
            continue  # the package's __init__.py
        seen: set[str] = set()
        for name in sorted(n for n in imports(f) if n.startswith(package + ".")):
            dst = unit_of(name, package)
            if dst == src or not ((root / dst).is_dir() or (root / f"{dst}.py").exists()):
                continue  # within the unit, or a name from the package's __init__.py
            if dst in seen:
                continue  # one report per (module, unit)
            seen.add(dst)
            where = f"{module_of(f).replace('.', '/')}.py imports {name}"
            if src not in floor or dst not in floor:
                problems.append(f"{where}: place {src if src not in floor else dst!r} in LAYERS")
            elif floor[dst] == floor[src]:
                problems.append(f"{where}: {src} and {dst} share a floor and must stay apart")
            elif floor[dst] < floor[src]:
                problems.append(f"{where}: {dst} is above {src}")
    return problems


def test_floors_only_point_down() -> None:
    assert back_imports() == []


@pytest.mark.parametrize("package", sorted(SUBLAYERS))
def test_floors_inside_the_architecture_packages_only_point_down(package: str) -> None:
    assert back_imports(ROOT / package, SUBLAYERS[package]) == []


@pytest.mark.parametrize("package", ["", *sorted(SUBLAYERS)])
def test_every_unit_is_placed_once(package: str) -> None:
    root, layers = (ROOT / package, SUBLAYERS[package]) if package else (ROOT, LAYERS)
    units = [u.strip() for floor in layers for u in floor.split("|")]
    assert len(units) == len(set(units))
    name = module_of(root / "__init__.py")
    present = {unit_of(module_of(f), name) for f in root.rglob("*.py")} - {""}
    assert present <= set(units), f"not in LAYERS: {sorted(present - set(units))}"


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The file of a fleet module (``fleet.contract.signal``), or None for a name in one
    (``fleet.contract.signal.SignalState``)."""
    base = root.parent.joinpath(*name.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.exists():
            return f
    return None


def agent_reaches_outside(root: Path = ROOT) -> list[str]:
    """Every fleet module the node agent's process can load (its package and the CLI
    command that runs it, followed through every import, deferred ones included) that is
    not the wire contract, the client layer or the tracing set-up."""
    todo = [*sorted((root / "agents").rglob("*.py")), root / "cli" / "agent.py"]
    seen: set[Path] = set()
    outside = []
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        for name in sorted(n for n in imports(f) if n.startswith("fleet.")):
            target = module_file(name, root)
            if target is None or target in seen:
                continue
            if not any(_matches(name, a) for a in AGENT_MAY_IMPORT):
                outside.append(f"{f.relative_to(root.parent)} imports {name}")
            todo.append(target)
    return sorted(set(outside))


def test_the_agent_imports_only_the_contract_and_the_client_layer() -> None:
    assert agent_reaches_outside() == []


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


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "fleet"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_checks_catch_what_they_forbid(tmp_path: Path) -> None:
    """Each rule above, broken on purpose in a throw-away tree, is reported."""
    root = _tree(tmp_path, {
        "world/__init__.py": "",
        "world/model.py": "from fleet.world.snapshot import build\n",  # up, inside world
        "world/snapshot.py": "def build(): ...\n",
        "config/__init__.py": "",
        "config/models.py": "",
        "contract/__init__.py": "",
        "contract/signal.py": "def f():\n    from fleet.config.models import X  # noqa\n",
        "agents/__init__.py": "",
        "agents/agent.py": "from fleet.contract.signal import f\n",  # reaches config through it
        "cli/__init__.py": "",
        "cli/agent.py": "",
    })
    assert back_imports(root) == [
        "fleet/contract/signal.py imports fleet.config.models: config is above contract"]
    assert back_imports(root / "world", SUBLAYERS["world"]) == [
        "fleet/world/model.py imports fleet.world.snapshot: snapshot is above model"]
    assert agent_reaches_outside(root) == [
        "fleet/contract/signal.py imports fleet.config.models"]
