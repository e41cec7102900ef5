#!/usr/bin/env bash
# podman on k0s-fleet's private image store, configured for this kind of host (lib.sh).
#   hack/image/podman.sh images
#   hack/image/podman.sh run --rm ghcr.io/k0s-fleet/k0s-fleet:0.1.0 --help
source "$(dirname "$0")/lib.sh"
configure_containers
exec podman "$@"
