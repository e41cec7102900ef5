"""`k0s-fleet demo` (the README's first command) runs to the end and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.testing.binaries import REPO_ROOT


@pytest.mark.parametrize("fast", [True])
def test_demo_upgrades_its_fleet_and_exits_zero(tmp_path: Path, fast: bool) -> None:
    cmd = [sys.executable, "-m", "fleet.cli", "demo", "--clusters", "1",
           "--control-planes", "1", "--workers", "2", "--timeout", "240",
           "--workdir", str(tmp_path)]
    if fast:
        cmd.append("--fast")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "120"},
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "all nodes upgraded" in proc.stdout
    assert "rollout summary" in proc.stdout
    spans = [json.loads(line) for f in (tmp_path / "traces").glob("*.jsonl")
             for line in f.read_text().splitlines()]
    assert {"node-upgrade", "reconcile"} <= {s["name"] for s in spans}, proc.stdout[-1500:]
    # one trace per node upgrade, printed with a Jaeger link (Jaeger is in the test world)
    traced = {s["trace_id"] for s in spans if s["name"] == "node-upgrade"}
    shown = [line for line in proc.stdout.splitlines() if line.startswith("trace of ")]
    assert len(shown) == 3 and all(line.split()[3] in traced for line in shown), shown
    assert all("/api/traces/" in line for line in shown), shown
