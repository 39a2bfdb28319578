#!/usr/bin/env bash
# Interleaved rounds of one Go benchmark across code versions: each version
# is built into its own test binary once, then every round runs each binary
# in turn, so that the versions share the machine's drift. Prints each
# run's ns/op and, per version, the median and the median of the paired
# ratios against the first version.
#
# usage: scripts/bench-rounds.sh PKG BENCH ROUNDS BENCHTIME VERSION...
#   PKG        a package path, e.g. ./spender/spenderhttp
#   BENCH      a -bench regexp that selects exactly one benchmark row
#   BENCHTIME  as -benchtime, e.g. 1s or 200000x
#   VERSION    a git revision, or "." for the working tree
set -euo pipefail
pkg=${1:?pkg}; bench=${2:?bench}; rounds=${3:?rounds}; benchtime=${4:?benchtime}; shift 4
[ $# -ge 1 ] || { echo "usage: $0 PKG BENCH ROUNDS BENCHTIME VERSION..." >&2; exit 2; }
root=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'for w in "$tmp"/wt-*; do [ -d "$w" ] && git -C "$root" worktree remove --force "$w"; done; rm -rf "$tmp"' EXIT
bins=()
for v in "$@"; do
  name=${v//[^A-Za-z0-9._-]/_}
  bin="$tmp/bin-$name.test"
  if [ "$v" = . ]; then
    (cd "$root" && go test -c -o "$bin" "$pkg")
  else
    git -C "$root" worktree add --detach -q "$tmp/wt-$name" "$v"
    (cd "$tmp/wt-$name" && go test -c -o "$bin" "$pkg")
  fi
  bins+=("$bin")
done
dir=$(cd "$root" && go list -f '{{.Dir}}' "$pkg")
for r in $(seq 1 "$rounds"); do
  for i in "${!bins[@]}"; do
    ns=$(cd "$dir" && "${bins[$i]}" -test.run '^$' -test.bench "$bench" -test.benchtime "$benchtime" -test.count 1 |
      awk '$0 ~ /ns\/op/ {for (k = 1; k < NF; k++) if ($(k+1) == "ns/op") print $k}' | head -1)
    [ -n "$ns" ] || { echo "no ns/op for $bench in ${!i}" >&2; exit 1; }
    echo "round $r version $(( i + 1 )) $ns"
  done
done | tee "$tmp/runs"
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
n=$#
i=1
for v in "$@"; do
  med=$(awk -v i="$i" '$4 == i {print $5}' "$tmp/runs" | median)
  ratio=$(awk -v i="$i" '$4 == 1 {b[$2] = $5} $4 == i {r[$2] = $5} END {for (k in r) print r[k] / b[k]}' "$tmp/runs" | median)
  printf 'version %d (%s): median %s ns/op, median paired ratio to version 1: %.3f\n' "$i" "$v" "$med" "$ratio"
  i=$((i + 1))
done
