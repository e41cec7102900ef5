import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "hack" / "testenv" / "gen_kube_gomod.py"
spec = importlib.util.spec_from_file_location("gen_kube_gomod", HERE)
assert spec and spec.loader
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)

UPSTREAM = """module k8s.io/kubernetes

go 1.26.0

require (
\tk8s.io/api v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/apiserver => ./staging/src/k8s.io/apiserver
\tgithub.com/x/y => github.com/x/y v1.0.0
)
"""


def test_render_pins_every_staging_module() -> None:
    out = gen.render(UPSTREAM, "v1.36.3")
    assert "require k8s.io/kubernetes v1.36.3" in out
    assert "\tk8s.io/api => k8s.io/api v0.36.3" in out
    assert "\tk8s.io/apiserver => k8s.io/apiserver v0.36.3" in out
    assert "github.com/x/y" not in out
    assert "go 1.26.0" in out
