#!/usr/bin/env bash
# Builds the ration image from static binaries compiled on this machine,
# so no base image is pulled (the Containerfile starts FROM scratch).
#
#   deploy/container/build.sh [IMAGE]        default IMAGE: localhost/ration:dev
#
# VERSION is the version the binaries report (allocator -version) and the
# image's label carry; default: git describe, else "dev".
# BUILDER is the command that builds (default: podman, else buildah, else
# docker), with any global options it needs, e.g.
# BUILDER="podman --storage-driver vfs".
set -euo pipefail
cd "$(dirname "$0")/../.."

image=${1:-localhost/ration:dev}
if [ -z "${BUILDER:-}" ]; then
  for b in podman buildah docker; do
    if command -v "$b" >/dev/null 2>&1; then BUILDER=$b; break; fi
  done
fi
[ -n "${BUILDER:-}" ] || { echo "build.sh: no podman, buildah or docker on PATH; set BUILDER" >&2; exit 1; }
version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
ca=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
[ -r "$ca" ] || { echo "build.sh: no CA bundle at $ca (install ca-certificates, or set CA_BUNDLE)" >&2; exit 1; }

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir "$ctx/bin" "$ctx/data"
# Every command under cmd/ goes in: a new one needs no change here.
CGO_ENABLED=0 go build -trimpath -o "$ctx/bin/" \
  -ldflags "-X github.com/rationhq/ration/internal/version.stamped=$version" ./cmd/...
cp "$ca" "$ctx/ca-certificates.crt"
cp LICENSE NOTICE "$ctx/"
# BUILDER is a command line: split on spaces on purpose.
# shellcheck disable=SC2086
$BUILDER build -f deploy/container/Containerfile --build-arg VERSION="$version" -t "$image" "$ctx"
