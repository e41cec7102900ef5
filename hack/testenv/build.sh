#!/usr/bin/env bash
# Builds the pinned kube-apiserver, etcd, helm, jaeger, Cluster API managers, promtool and
# prometheus used by the test world from the official Go modules, into a cache keyed by the
# pins; a second run builds nothing. The CAPI CRDs and webhook configurations are copied from the same
# module versions into $cache/capi/<version>/ (never into the repository).
#
#   hack/testenv/build.sh            # prints the bin directory on the last line
#
# K0S_FLEET_CACHE overrides the cache root (default: ~/.cache/k0s-fleet).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=pins.env
source "$here/pins.env"
cache=${K0S_FLEET_CACHE:-$HOME/.cache/k0s-fleet}
bin="$cache/bin"
work="$cache/work"
mkdir -p "$bin" "$work"
# GOTOOLCHAIN=auto lets an older Go fetch the toolchain the pinned modules need from the module proxy.
export GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-auto} CGO_ENABLED=0

log() { printf '[testenv] %s\n' "$*" >&2; }

# Stamp the version as the Kubernetes release build does, so /version (and helm's
# kubeVersion checks, kubectl's skew warning) see v1.Y.Z rather than v0.0.0-master.
version_ldflags() {
  local v=${KUBE_VERSION#v} pkg=k8s.io/component-base/version
  local major=${v%%.*} rest=${v#*.}
  local minor=${rest%%.*}
  printf -- '-X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s -X %s.gitTreeState=clean' \
    "$pkg" "$KUBE_VERSION" "$pkg" "$major" "$pkg" "$minor" "$pkg"
}

build_kube_apiserver() {
  local out="$bin/kube-apiserver-$KUBE_VERSION-$KUBE_BUILD_REV"
  [[ -x $out ]] && return
  local dir="$work/kube-apiserver-$KUBE_VERSION"
  rm -rf "$dir" && mkdir -p "$dir"
  log "generating go.mod for k8s.io/kubernetes $KUBE_VERSION"
  local upstream_mod
  upstream_mod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  python3 "$here/gen_kube_gomod.py" "$upstream_mod" "$KUBE_VERSION" >"$dir/go.mod"
  cat >"$dir/tools.go" <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
GO
  log "building kube-apiserver $KUBE_VERSION (cold: several minutes)"
  (cd "$dir" && go mod tidy >/dev/null 2>&1 || true
   cd "$dir" && go build -trimpath -ldflags="-s $(version_ldflags)" -o "$out.tmp" \
     k8s.io/kubernetes/cmd/kube-apiserver)
  mv "$out.tmp" "$out"
}

build_etcd() {
  local out="$bin/etcd-$ETCD_VERSION"
  [[ -x $out ]] && return
  local dir="$work/etcd-$ETCD_VERSION"
  rm -rf "$dir" && mkdir -p "$dir"
  cp "$here/etcd/main.go" "$dir/"
  cat >"$dir/go.mod" <<MOD
module k0s-fleet.test/etcd

go 1.24

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
MOD
  log "building etcd $ETCD_VERSION"
  (cd "$dir" && go mod tidy && go build -trimpath -ldflags=-s -o "$out.tmp" .)
  mv "$out.tmp" "$out"
}

build_helm() {
  local out="$bin/helm-$HELM_VERSION"
  [[ -x $out ]] && return
  log "building helm $HELM_VERSION"
  local gobin="$work/helm-$HELM_VERSION"
  mkdir -p "$gobin"
  GOBIN="$gobin" GOFLAGS= go install -trimpath -ldflags=-s "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
  mv "$gobin/helm" "$out"
}

# Jaeger v2 (an OpenTelemetry collector distribution with in-memory trace storage and
# the query API): the trace backend of the tracing tests. Its module has replace
# directives, so it is built from a wrapper module that repeats them.
build_jaeger() {
  local out="$bin/jaeger-$JAEGER_VERSION"
  [[ -x $out ]] && return
  local dir="$work/jaeger-$JAEGER_VERSION" upstream_mod
  rm -rf "$dir" && mkdir -p "$dir"
  upstream_mod=$(cd "$dir" && go mod download -json "github.com/jaegertracing/jaeger@$JAEGER_VERSION" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    printf 'module k0s-fleet.test/jaeger\n\ngo 1.25\n\nrequire github.com/jaegertracing/jaeger %s\n\n' \
      "$JAEGER_VERSION"
    grep -E '^replace ' "$upstream_mod" || true
  } >"$dir/go.mod"
  cat >"$dir/tools.go" <<'GO'
//go:build tools

package tools

import _ "github.com/jaegertracing/jaeger/cmd/jaeger"
GO
  log "building jaeger $JAEGER_VERSION (cold: several minutes)"
  (cd "$dir" && go mod tidy >/dev/null && go build -trimpath -ldflags=-s -o "$out.tmp" \
     github.com/jaegertracing/jaeger/cmd/jaeger)
  mv "$out.tmp" "$out"
}

# promtool and prometheus from the Prometheus Go module (v3.X.Y is tagged v0.3XX.Y), through
# a wrapper module requiring it. -tags remove_all_sd leaves out every service discovery but
# static/file configs (the test scrapes one known address), so the cloud SDKs are neither
# downloaded nor compiled; the web UI's assets are not embedded (the HTTP API is all the
# tests use). Both binaries are built in one step (they share most packages).
build_prometheus() {
  local promtool="$bin/promtool-$PROMETHEUS_VERSION-$PROMETHEUS_BUILD_REV"
  local prometheus="$bin/prometheus-$PROMETHEUS_VERSION-$PROMETHEUS_BUILD_REV"
  [[ -x $promtool && -x $prometheus ]] && return
  local dir="$work/prometheus-$PROMETHEUS_VERSION" go_line
  rm -rf "$dir" && mkdir -p "$dir"
  go_line=$(cd "$dir" && go mod download -json "github.com/prometheus/prometheus@$PROMETHEUS_VERSION" \
    | python3 -c 'import json,sys; print(next(l for l in open(json.load(sys.stdin)["GoMod"]) if l.startswith("go ")).strip())')
  printf 'module k0s-fleet.test/prometheus\n\n%s\n\nrequire github.com/prometheus/prometheus %s\n' \
    "$go_line" "$PROMETHEUS_VERSION" >"$dir/go.mod"
  # Version as upstream's release build stamps it (v0.316.0 -> 3.16.0).
  local v=${PROMETHEUS_VERSION#v0.} pkg=github.com/prometheus/common/version
  local minor=${v%%.*} patch=${v#*.}
  local flags="-s -X $pkg.Version=${minor:0:1}.$((10#${minor:1})).$patch -X $pkg.Branch=HEAD"
  log "building promtool and prometheus $PROMETHEUS_VERSION (cold: several minutes)"
  # No `go mod tidy` (it would fetch every SD plugin's SDK for all build tags): -mod=mod
  # adds only what the tagged build imports.
  (cd "$dir" \
   && go build -tags remove_all_sd -trimpath -ldflags="$flags" -o "$promtool.tmp" \
        github.com/prometheus/prometheus/cmd/promtool \
   && go build -tags remove_all_sd -trimpath -ldflags="$flags" -o "$prometheus.tmp" \
        github.com/prometheus/prometheus/cmd/prometheus)
  mv "$promtool.tmp" "$promtool"
  mv "$prometheus.tmp" "$prometheus"
}

# The Cluster API core manager at version $1, main package $2 (v1.14 moved it to ./core
# and its Go API into the module sigs.k8s.io/cluster-api/api, whose in-repo replace does
# not apply to a dependency: pin it to the same version), plus the module's CRDs and
# webhook configurations, where the test world reads them.
build_capi() {
  local version=$1 main=$2 config=$3 api_module=$4
  local out="$bin/capi-manager-$version-$CAPI_BUILD_REV"
  local data="$cache/capi/$version"
  [[ -x $out && -d $data/crds ]] && return
  local dir="$work/capi-$version"
  rm -rf "$dir" && mkdir -p "$dir"
  local go_line
  go_line=$(cd "$dir" && go mod download -json "sigs.k8s.io/cluster-api@$version" \
    | python3 -c 'import json,sys; print(next(l for l in open(json.load(sys.stdin)["GoMod"]) if l.startswith("go ")).strip())')
  {
    printf 'module k0s-fleet.test/capi\n\n%s\n\nrequire sigs.k8s.io/cluster-api %s\n' \
      "$go_line" "$version"
    [[ $api_module == yes ]] && printf 'require sigs.k8s.io/cluster-api/api %s\n' "$version"
  } >"$dir/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$main" >"$dir/tools.go"
  log "building Cluster API manager $version (cold: several minutes)"
  local pkg=sigs.k8s.io/cluster-api/version
  local v=${version#v}
  (cd "$dir" && go mod tidy >/dev/null 2>&1 || true
   cd "$dir" && go build -trimpath -o "$out.tmp" -ldflags="-s -X $pkg.gitVersion=$version \
     -X $pkg.gitMajor=${v%%.*} -X $pkg.gitMinor=$(cut -d. -f2 <<<"$v") -X $pkg.gitTreeState=clean" \
     "$main")
  local src
  src=$(cd "$dir" && go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api)
  rm -rf "$data.tmp" && mkdir -p "$data.tmp/crds" "$data.tmp/webhook"
  cp "$src/$config"/crd/bases/*.yaml "$data.tmp/crds/"
  cp "$src/$config/webhook/manifests.yaml" "$data.tmp/webhook/"
  chmod -R u+w "$data.tmp"
  rm -rf "$data" && mv "$data.tmp" "$data"
  mv "$out.tmp" "$out"
}

# One build at a time per cache (parallel `make test` runs share it).
exec 9>"$cache/.build.lock"
flock 9
start=$(date +%s)
build_etcd
build_helm
build_kube_apiserver
build_jaeger
build_capi "$CAPI_VERSION" sigs.k8s.io/cluster-api/core core/config yes
build_capi "$CAPI_OLD_VERSION" sigs.k8s.io/cluster-api config no
build_prometheus
# Stable names for the harness; the versioned files are the cache keys.
ln -sf "kube-apiserver-$KUBE_VERSION-$KUBE_BUILD_REV" "$bin/kube-apiserver"
ln -sf "etcd-$ETCD_VERSION" "$bin/etcd"
ln -sf "helm-$HELM_VERSION" "$bin/helm"
ln -sf "jaeger-$JAEGER_VERSION" "$bin/jaeger"
ln -sf "capi-manager-$CAPI_VERSION-$CAPI_BUILD_REV" "$bin/capi-manager-$CAPI_VERSION"
ln -sf "capi-manager-$CAPI_OLD_VERSION-$CAPI_BUILD_REV" "$bin/capi-manager-$CAPI_OLD_VERSION"
ln -sf "promtool-$PROMETHEUS_VERSION-$PROMETHEUS_BUILD_REV" "$bin/promtool"
ln -sf "prometheus-$PROMETHEUS_VERSION-$PROMETHEUS_BUILD_REV" "$bin/prometheus"
log "binaries ready in $(( $(date +%s) - start ))s"
echo "$bin"
