#!/usr/bin/env bash
# Interleaved rounds of BenchmarkLoopback: each round runs the echo handler,
# then the allocator (one test binary per code version given), on the same
# row, so that every allocator run has an echo run beside it in time. On a
# shared VM whose speed drifts by several percent from minute to minute,
# per-round ratios are steadier than ratios of -count runs taken one side
# after the other.
#
# usage: allocator/testdata/loopback-rounds.sh ROUNDS ROW CALLS [VERSION ...]
#   ROW     a BenchmarkLoopback sub-benchmark row: connect/keys=64, grpc/keys=1, ...
#   CALLS   calls per run (-benchtime CALLSx)
#   VERSION what to compare (default: the working tree only): REV[,FLAG...],
#           a git revision ("." for the working tree), each built into its own
#           test binary from a temporary worktree, and test flags for its
#           allocator runs, e.g. .,-bench.linger=4ms .,-loopback.extraprocs=1
# Prints one line per run (round, version, echo calls/s, allocator calls/s,
# ratio, cpu-µs per call of each, their ratio echo ÷ allocator, calls per
# commit) and the median ratios per version. Both processes are CPU-bound,
# so the CPU ratio predicts the calls/s ratio on idle cores, and it moves
# far less than calls/s when other processes share them.
set -euo pipefail
rounds=${1:?rounds}; row=${2:?row}; calls=${3:?calls}; shift 3
root=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'for w in "$tmp"/wt-*; do [ -d "$w" ] && git -C "$root" worktree remove --force "$w"; done; rm -rf "$tmp"' EXIT
versions=(); bins=()
[ $# -eq 0 ] && set -- .
for v in "$@"; do
  rev=${v%%,*}; name=${rev//[^A-Za-z0-9._-]/_}
  bin="$tmp/bin-$name.test"
  if [ ! -x "$bin" ]; then
    if [ "$rev" = . ]; then
      (cd "$root" && go test -c -o "$bin" ./allocator/)
    else
      git -C "$root" worktree add --detach -q "$tmp/wt-$name" "$rev"
      (cd "$tmp/wt-$name" && go test -c -o "$bin" ./allocator/)
    fi
  fi
  versions+=("$v")
  bins+=("$bin")
done
metric() { awk -v m="$1" '{for (i = 1; i < NF; i++) if ($(i+1) == m) print $i}'; }
out="$tmp/runs"
for r in $(seq "$rounds"); do
  for i in "${!versions[@]}"; do
    v=${versions[$i]}; bin=${bins[$i]}; flags=()
    [ "$v" != "${v%%,*}" ] && IFS=, read -r -a flags <<<"${v#*,}"
    e=$("$bin" -test.run '^$' -test.bench "^BenchmarkLoopback$/^${row%%/*}$/^${row#*/}$/^echo$" -test.benchtime "${calls}x" | grep '^Benchmark')
    a=$("$bin" -test.run '^$' -test.bench "^BenchmarkLoopback$/^${row%%/*}$/^${row#*/}$/^allocator$" -test.benchtime "${calls}x" "${flags[@]}" | grep '^Benchmark')
    ec=$(metric calls/s <<<"$e"); ac=$(metric calls/s <<<"$a")
    eu=$(metric cpu-µs/call <<<"$e"); au=$(metric cpu-µs/call <<<"$a")
    printf '%s %s echo %s allocator %s ratio %.3f cpu-us %s/%s cpu-ratio %.3f calls/commit %s cores %s\n' "$r" "$v" "$ec" "$ac" \
      "$(awk -v a="$ac" -v e="$ec" 'BEGIN{print a/e}')" "$eu" "$au" "$(awk -v a="$au" -v e="$eu" 'BEGIN{print e/a}')" \
      "$(metric calls/commit <<<"$a")" "$(metric cores <<<"$a")" | tee -a "$out"
  done
done
for v in "${versions[@]}"; do
  for f in 8:ratio 12:cpu-ratio; do
    awk -v v="$v" -v c="${f%%:*}" '$2 == v {print $c}' "$out" | sort -n | awk -v v="$v" -v n="${f#*:}" '{x[NR] = $1} END {m = (NR % 2) ? x[(NR+1)/2] : (x[NR/2] + x[NR/2+1]) / 2; printf "%s: median %s %.3f over %d rounds (min %.3f, max %.3f)\n", v, n, m, NR, x[1], x[NR]}'
  done
done
