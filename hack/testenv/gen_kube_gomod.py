"""Writes the go.mod of a wrapper module that builds kube-apiserver from k8s.io/kubernetes.

k8s.io/kubernetes replaces every staging module (k8s.io/api, k8s.io/apiserver, ...)
with a path inside its own tree; a module depending on it must pin each of those to the
matching published v0.Y.Z tag instead. The list comes from the tag's own go.mod, so
nothing here is maintained by hand.

usage: gen_kube_gomod.py <path of k8s.io/kubernetes go.mod> <v1.Y.Z>
"""

from __future__ import annotations

import re
import sys

STAGING = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/src/")
GO_DIRECTIVE = re.compile(r"^go\s+(\S+)", re.MULTILINE)


def staging_modules(upstream: str) -> list[str]:
    return sorted({m.group(1) for line in upstream.splitlines() if (m := STAGING.match(line))})


def render(upstream: str, version: str) -> str:
    _major, minor, patch = version.lstrip("v").split(".")
    staging_version = f"v0.{minor}.{patch}"
    go = GO_DIRECTIVE.search(upstream)
    lines = [
        "module k0s-fleet.test/kube-apiserver",
        "",
        f"go {go.group(1) if go else '1.24'}",
        "",
        f"require k8s.io/kubernetes {version}",
        "",
        "replace (",
    ]
    lines += [f"\t{mod} => {mod} {staging_version}" for mod in staging_modules(upstream)]
    lines.append(")")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    path, version = sys.argv[1], sys.argv[2]
    with open(path, encoding="utf-8") as fh:
        sys.stdout.write(render(fh.read(), version))
