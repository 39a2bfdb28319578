#!/usr/bin/env bash
# Lints the lease protocol, regenerates its Go and connect code with the
# pinned tools (proto/tools/go.mod) and fails if the result differs from what
# is committed. Run from anywhere: bash proto/check-generated.sh
set -euo pipefail
cd "$(dirname "$0")"

go tool -modfile=tools/go.mod buf lint
go tool -modfile=tools/go.mod buf format -d --exit-code
# Remove every generated file first: buf.gen.yaml cannot use clean: true
# (the output directory is proto/ itself), and a file whose .proto was
# deleted must show up as a diff too.
find . -path ./tools -prune -o \( -name '*.pb.go' -o -name '*.connect.go' \) -type f -print0 | xargs -0 -r rm -f
go tool -modfile=tools/go.mod buf generate

if [ -n "$(git status --porcelain -- .)" ]; then
  echo "FAIL: generated code under proto/ is stale; run: (cd proto && go tool -modfile=tools/go.mod buf generate)" >&2
  git status --porcelain -- . >&2
  git --no-pager diff --stat -- . >&2
  exit 1
fi
echo "proto: lint clean, generated code up to date"
