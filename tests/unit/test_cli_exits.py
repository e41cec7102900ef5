"""Exit codes mean one thing each; -o text|json|yaml; upgrade's waiting prints at least
every 30 s (fleet/cli)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fleet.cli import common, main
from fleet.cli.upgrade import Printer


@pytest.fixture(autouse=True)
def no_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("K0S_FLEET_CONFIG", "KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def test_exit_codes_are_distinct() -> None:
    codes = [e.value for e in common.Exit]
    assert len(codes) == len(set(codes)), common.Exit.__members__
    assert (int(common.Exit.BAD_CONFIG), int(common.Exit.NOT_DONE),
            int(common.Exit.LOST_LEADERSHIP)) == (2, 3, 4)


def test_every_exit_code_in_the_help_epilog(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("upgrade", "plan", "status", "controller"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert "exit codes:" in out
        for code in common.Exit:
            assert f"\n  {code.value} " in out, (command, code)


@pytest.mark.parametrize("argv", [
    ["upgrade", "not-a-version"],
    ["upgrade", "v1.31.3+k0s.0", "--selector", "a in (b"],
    ["upgrade", "v1.31.3+k0s.0", "--timeout", "soon"],
    ["upgrade", "v1.31.3+k0s.0", "--kubeconfig", "/nonexistent/kubeconfig"],
    ["upgrade", "v1.31.3+k0s.0"],  # no kubeconfig anywhere
    ["plan", "--now", "yesterday-ish"],
    ["plan", "--node-duration", "a while"],
    ["status", "--once", "--interval", "often"],
    ["status", "--once", "--kubeconfig", "/nonexistent/kubeconfig"],
])
def test_bad_input_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == common.Exit.BAD_CONFIG
    err = capsys.readouterr().err
    assert err.startswith(f"k0s-fleet {argv[0]}: "), err


def test_unreadable_kubeconfig_names_it(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "kc.yaml"
    bad.write_text("{nope: [")
    assert main(["plan", "--kubeconfig", str(bad)]) == common.Exit.BAD_CONFIG
    assert str(bad) in capsys.readouterr().err


def test_output_formats() -> None:
    doc = {"b": [1, {"c": "x"}], "a": None}
    assert json.loads(common.dump(doc, "json")) == doc
    assert yaml.safe_load(common.dump(doc, "yaml")) == doc
    for command in ("upgrade", "plan", "status"):
        for fmt in ("text", "json", "yaml"):
            # argparse accepts it (exits 2 itself for an unknown choice)
            with pytest.raises(SystemExit) as e:
                main([command, "-o", fmt, "--help"])
            assert e.value.code == 0


def status(phase: str, done: int) -> dict[str, object]:
    return {"status": {"phase": phase, "observedGeneration": 1, "nodesUpToDate": done,
                       "nodesTotal": 3, "summary": f"{done}/3"}}


def test_waiting_prints_at_least_every_30_seconds() -> None:
    p = Printer("text", started=100.0)
    out, err = p.update(status("Progressing", 1), 100.0)
    assert out.startswith("Progressing: 1/3 clusters, 1/3 nodes") and not err
    assert p.update(status("Progressing", 1), 129.0) == ("", "")
    out, err = p.update(status("Progressing", 1), 130.0)
    assert "still waiting, 0m30s" in out and out.startswith("Progressing") and not err
    assert p.update(status("Progressing", 1), 159.9) == ("", "")
    out, _ = p.update(status("Progressing", 1), 100.0 + 3725)
    assert "still waiting, 1h02m05s" in out
    out, _ = p.update(status("Progressing", 2), 100.0 + 3726)  # a change: the plain line
    assert out.startswith("Progressing: 2/3") and "still" not in out
    # json/yaml keep stdout to documents: the reminder goes to stderr
    for fmt, parse in (("json", json.loads), ("yaml", yaml.safe_load)):
        q = Printer(fmt, started=0.0)
        out, _ = q.update(status("Progressing", 1), 0.0)
        assert parse(out.removeprefix("---\n"))["phase"] == "Progressing"
        out, err = q.update(status("Progressing", 1), 31.0)
        assert out == "" and "still waiting (0m31s)" in err
    # before the controller has seen the FleetUpgrade at all
    w = Printer("text", started=0.0)
    assert w.waiting(0.0) == ""
    assert w.waiting(29.0) == ""
    assert "still waiting for the controller" in w.waiting(30.0)
