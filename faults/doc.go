//go:build faults

// Package faults is ration's fault suite: Go tests that build
// cmd/allocator and cmd/gateway-demo, run them as real processes on
// loopback (an allocator cluster's members each in a network namespace of
// their own), hurt them the way production does (kill -9, SIGSTOP, a
// network partition, a full disk, idle and slow connections, declared
// bodies that never arrive, CPU starvation, skewed traffic across
// processes) and check from counts what ration promises under each:
//
//   - the over-admission bound of docs/bound.md, with fallback admissions
//     bounded as docs/leasing.md states, for every case that sends traffic:
//     what the gateways admitted (their clients' 200s, cross-checked with
//     the gateways' own counters) never exceeds what the key's limit allows
//     over the run;
//   - gateways keep serving through allocator faults (every answer is 200
//     or 429, never a 5xx), and go back to leases once the allocator is
//     back;
//   - an allocator cluster serves again within seconds of losing its
//     leader (killed, stopped or cut off), keeps the bound over every
//     window spanning the loss, and applies no spender's call twice (its
//     members' raft logs, replayed, say so);
//   - servers cut idle connections and slow or absent bodies within their
//     timeouts, and hold neither goroutines, file descriptors nor memory
//     for them;
//   - a healthy fleet under CPU stress never refuses a request below the
//     limit and never falls back, and separate gateway processes share a
//     key as well as instances in one process do;
//   - docs/cluster.md's recipe, its shell blocks run as written, gives a
//     working three-member cluster that fails over;
//   - hostile callers are refused, with the cluster serving and the bound
//     held: a credential at another role's door, a stranger or a rogue
//     member at the raft port (term hijack, log injection, oversize
//     frames: the replicas stay byte-identical), hostile backups and
//     membership changes, 20,000 connections that never authenticate,
//     damaged stores (refused at start, never a panic);
//   - what clients are told (docs/contract.md): a client that comes back
//     when Retry-After says is admitted, an idle gateway gives a key's
//     budget back within a TTL, and a key below its limit sees no 429
//     through any loss of an allocator cluster's leader.
//
// The tests are behind the build tag faults, so `go test ./...` does not
// run them:
//
//	go test -tags faults -count=1 -v ./faults
//
// They need Linux and root (the full-disk case mounts a tmpfs, the
// cluster cases build network namespaces with iproute2's ip), and take
// about seven minutes on two cores (the two client-contract cases, run
// beside each other at the end, two of them). Every process a test starts
// is killed when the test ends, and its log is printed if the test
// failed; see docs/faults.md for what each case measures.
package faults
