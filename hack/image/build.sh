#!/usr/bin/env bash
# `make image`: builds the image from the project's one Dockerfile without a Docker engine
# or a registry (buildah), on a locally built base (hack/image/base.sh), and writes it as
# an OCI archive tagged <chart's default repository>:<project version>:
#
#   build/image/k0s-fleet-<version>.oci.tar     (skopeo copy / podman load it; see
#                                                docs/operations.md "Build the image")
#
# PYTHON_IMAGE=<reference> builds on another base already in the store instead.
source "$(dirname "$0")/lib.sh"
configure_containers
mapfile -t need < <(missing_tools)
((${#need[@]} == 0)) || die "missing tools: ${need[*]} (run hack/image/tools.sh as root)"

ref=$(image_ref)
version=$(project_version)
archive=$(image_archive)
base=${PYTHON_IMAGE:-$("$IMAGE_HACK/base.sh")}

# The build's pip reaches PyPI through the host's pip configuration and CA bundle when the
# host has them (e.g. a TLS-intercepting proxy): bind-mounted for the RUN steps only, never
# part of a layer.
mounts=()
[[ -f /etc/pip.conf ]] && mounts+=(--volume /etc/pip.conf:/etc/pip.conf:ro)
[[ -f /etc/ssl/certs/ca-certificates.crt ]] \
  && mounts+=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)

ilog "building $ref on $base"
t0=$(date +%s.%N)
# chroot isolation: RUN steps need no OCI runtime, cgroups or network namespace.
buildah bud --quiet --layers --isolation chroot --network host "${mounts[@]}" \
  --build-arg PYTHON_IMAGE="$base" --build-arg VERSION="$version" \
  --file "$REPO_ROOT/Dockerfile" --tag "$ref" "$REPO_ROOT" >/dev/null
t1=$(date +%s.%N)

# Earlier builds' untagged images (replaced finals, stale build stages) older than a day;
# recent ones stay as the layer cache.
podman image prune --force --filter until=24h >/dev/null

mkdir -p "$(dirname "$archive")"
rm -f "$archive"
buildah push --quiet "$ref" "oci-archive:$archive:$ref" >/dev/null

size=$(podman image inspect --format '{{.Size}}' "$ref")
ilog "$(awk -v r="$ref" -v t0="$t0" -v t1="$t1" -v s="$size" -v a="$archive" \
  -v as="$(stat -c %s "$archive")" \
  'BEGIN {printf "built %s in %.0f s: %.0f MB unpacked; %s (%.0f MB)", r, t1 - t0, s / 1e6, a, as / 1e6}')"
printf '%s\n' "$archive"
