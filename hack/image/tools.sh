#!/usr/bin/env bash
# Installs the Debian packages `make image` needs (mmdebstrap, buildah, podman, runc,
# skopeo) when one is missing; prints nothing else when all are there.
source "$(dirname "$0")/lib.sh"
mapfile -t need < <(missing_tools)
((${#need[@]})) || exit 0
[[ $(id -u) == 0 ]] && command -v apt-get >/dev/null \
  || die "missing tools: ${need[*]} (install these Debian packages as root)"
ilog "installing Debian packages: ${need[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
