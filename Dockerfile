# syntax=docker/dockerfile:1
# The one image behind both charts: `k0s-fleet controller` (management cluster) and
# `k0s-fleet agent` (DaemonSet on workload clusters).
#
#   docker build -t ghcr.io/k0s-fleet/k0s-fleet:0.1.0 .
#
# (without a Docker engine or registry: `make image`, hack/image/build.sh, which builds the
# same file with buildah on a Debian base made locally; see docs/operations.md.)
#
# Base image: pinned by full tag. For a reproducible release, resolve it once and pin the
# digest too:  docker buildx imagetools inspect python:3.11.14-slim-bookworm
#   --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:<digest>
# Both stages must use the same image: the virtualenv links to its interpreter.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/k0s-fleet
WORKDIR /src
# Metadata first: the dependency layer is reused while only fleet/ changes. The stub
# package and its build output go again: setuptools would otherwise keep build/lib's empty
# fleet/__init__.py (newer than the copied one, whose mtime COPY preserves).
COPY pyproject.toml README.md ./
RUN mkdir fleet && touch fleet/__init__.py \
 && /opt/k0s-fleet/bin/pip install . \
 && /opt/k0s-fleet/bin/pip uninstall -y k0s-fleet \
 && rm -rf fleet build ./*.egg-info
COPY fleet ./fleet
# pip and setuptools only install: the running image needs neither.
RUN /opt/k0s-fleet/bin/pip install --no-deps . \
 && /opt/k0s-fleet/bin/python -m pip uninstall -q -y pip setuptools \
 && /opt/k0s-fleet/bin/python -m compileall -q /opt/k0s-fleet/lib \
 && /opt/k0s-fleet/bin/k0s-fleet --help >/dev/null

FROM ${PYTHON_IMAGE}
# The project's version (pyproject.toml, the charts' appVersion): the image's tag.
ARG VERSION=0.1.0
# source: the repository behind ghcr.io/k0s-fleet/k0s-fleet (the charts' default image).
LABEL org.opencontainers.image.title="k0s-fleet" \
      org.opencontainers.image.description="In-place k0s upgrades across a fleet of Cluster API / k0smotron clusters" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/k0s-fleet/k0s-fleet" \
      org.opencontainers.image.licenses="Apache-2.0"
# Only the virtualenv is copied: no compiler, no pip cache, no sources.
COPY --from=build /opt/k0s-fleet /opt/k0s-fleet
ENV PATH=/opt/k0s-fleet/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# Non-root by default (65532, "nonroot" by convention); the controller chart keeps it.
# The agent chart runs as uid 0 without capabilities: it replaces the root-owned k0s
# binary on the host (see charts/k0s-fleet-agent/values.yaml).
USER 65532:65532
ENTRYPOINT ["k0s-fleet"]
CMD ["--help"]
