# shellcheck shell=bash
# Shared by hack/image/*.sh: where the image tools keep their state, and how they must be
# configured to run in this kind of sandbox (see docs/operations.md "Build the image").
#
# Everything lives in a private store under the k0s-fleet cache, configured through
# CONTAINERS_CONF / CONTAINERS_STORAGE_CONF, so the host's own container storage (if any)
# is never touched:
#   - runtime runc with cgroupfs: crun 1.8 refuses hybrid cgroup v1/v2 hosts;
#   - explicit ulimits no higher than ours: without CAP_SYS_RESOURCE the runtime cannot
#     raise them to podman's defaults (nofile 1048576) and refuses to start;
#   - storage driver overlay (K0S_FLEET_STORAGE_DRIVER=vfs where overlay is unavailable).
set -euo pipefail

IMAGE_HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$IMAGE_HACK/../.." && pwd)
IMAGE_CACHE=${K0S_FLEET_IMAGE_CACHE:-${K0S_FLEET_CACHE:-$HOME/.cache/k0s-fleet}/image}
# The OCI archive `make image` produces.
IMAGE_OUT=${K0S_FLEET_IMAGE_OUT:-$REPO_ROOT/build/image}

ilog() { printf '[image] %s\n' "$*" >&2; }
die() { printf '[image] error: %s\n' "$*" >&2; exit 1; }

# The chart's default repository and the project's version: the one image reference.
image_repository() {
  awk '/^image:/ {f = 1; next} f && /^[^ ]/ {exit} f && $1 == "repository:" {print $2; exit}' \
    "$REPO_ROOT/charts/k0s-fleet/values.yaml"
}
project_version() {
  sed -n 's/^version = "\(.*\)"$/\1/p' "$REPO_ROOT/pyproject.toml" | head -n1
}
image_ref() { printf '%s:%s\n' "$(image_repository)" "$(project_version)"; }
image_archive() { printf '%s/k0s-fleet-%s.oci.tar\n' "$IMAGE_OUT" "$(project_version)"; }

# Tools `make image` needs, as "command:debian-package".
IMAGE_TOOLS=(mmdebstrap:mmdebstrap buildah:buildah podman:podman runc:runc skopeo:skopeo)

missing_tools() {
  local t out=()
  for t in "${IMAGE_TOOLS[@]}"; do
    command -v "${t%%:*}" >/dev/null || out+=("${t#*:}")
  done
  ((${#out[@]} == 0)) || printf '%s\n' "${out[@]}"
}

configure_containers() {
  local conf="$IMAGE_CACHE/conf" store="$IMAGE_CACHE/storage"
  # runroot: locks and mount state of this store (one per store), in /run.
  local runroot
  runroot=/run/k0s-fleet-image/$(printf '%s' "$store" | sha256sum | cut -c1-12)
  mkdir -p "$conf" "$store" "$runroot"
  local nofile nproc
  nofile=$(ulimit -Hn); [[ $nofile == unlimited ]] && nofile=1048576
  nproc=4096
  # Written on every use (paths and limits are this host's), atomically: runs may overlap.
  local sc cc
  sc=$(mktemp "$conf/storage.XXXXXX") cc=$(mktemp "$conf/containers.XXXXXX")
  cat >"$sc" <<CONF
[storage]
driver = "${K0S_FLEET_STORAGE_DRIVER:-overlay}"
graphroot = "$store"
runroot = "$runroot"
CONF
  cat >"$cc" <<CONF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
  chmod 644 "$sc" "$cc"
  mv "$sc" "$conf/storage.conf"
  mv "$cc" "$conf/containers.conf"
  export CONTAINERS_STORAGE_CONF="$conf/storage.conf" CONTAINERS_CONF="$conf/containers.conf"
}
