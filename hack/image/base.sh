#!/usr/bin/env bash
# Builds the Dockerfile's base image locally, for a sandbox without a container registry:
# a minimal Debian bookworm root filesystem with Python 3.11 (Debian's python3, the same
# minor version as the public python:3.11-slim-bookworm base), from Debian's packages via
# mmdebstrap. It provides what the Dockerfile uses from its base: `python` with the venv
# module, CA certificates, /bin/sh. Prints the local image reference on stdout.
#
# Cached by recipe: the root filesystem tarball under $K0S_FLEET_CACHE/image and the image
# in the private store; K0S_FLEET_IMAGE_REFRESH=1 rebuilds both (for Debian's updates).
source "$(dirname "$0")/lib.sh"
configure_containers

suite=bookworm
recipe=(
  --variant=essential
  # merged /usr by mmdebstrap's hook, not the usrmerge package (which pulls in perl)
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --include=python3,python3-venv,python-is-python3,ca-certificates
  --aptopt='APT::Install-Recommends "false"'
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  "$suite"
)
key=$(printf '%s\n' "${recipe[@]}" | sha256sum | cut -c1-12)
ref=localhost/k0s-fleet-base:python3.11-$suite-$key
tarball=$IMAGE_CACHE/base-$suite-$key.tar

# One builder at a time per cache (the tarball and the image share a name).
exec 9>"$IMAGE_CACHE/base.lock"
flock 9

if [[ ${K0S_FLEET_IMAGE_REFRESH:-} == 1 ]]; then
  rm -f "$tarball"
  buildah rmi "$ref" >/dev/null 2>&1 || true
fi

if ! buildah inspect --type image "$ref" >/dev/null 2>&1; then
  if [[ ! -s $tarball ]]; then
    ilog "mmdebstrap: Debian $suite root filesystem with Python (takes a minute or two)"
    rm -rf "$tarball.tmp"
    mmdebstrap --format=tar "${recipe[@]}" "$tarball.tmp" >"$tarball.log" 2>&1 \
      || { tail -n 30 "$tarball.log" >&2; die "mmdebstrap failed (log: $tarball.log)"; }
    mv "$tarball.tmp" "$tarball"
  fi
  ilog "importing $tarball as $ref"
  ctr=$(buildah from scratch)
  trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
  buildah add --quiet "$ctr" "$tarball" / >/dev/null
  # What the Dockerfile relies on from python:*-slim besides the files themselves.
  buildah config \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 \
    --cmd python3 \
    --label org.opencontainers.image.description="Debian $suite + python3 (mmdebstrap), local base for k0s-fleet" \
    "$ctr"
  buildah commit --quiet "$ctr" "$ref" >/dev/null
fi
printf '%s\n' "$ref"
