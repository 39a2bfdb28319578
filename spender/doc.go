// Package spender admits LLM requests against each API key's
// requests-per-minute and tokens-per-minute budgets, in process, with no
// network on the hot path.
//
// A Limiter holds two token buckets per key (see package bucket): RPM and
// TPM, each of capacity C (the limit, or its burst) refilled continuously
// at C per minute and starting full. A request's Cost (1 request and an
// estimate of its tokens) is reserved in both or in neither. When the
// response is known, the Reservation is settled with the actual usage:
// unused tokens come back (capped at C), an overrun is charged even below
// zero, a debt the key's next requests wait off. Cancel returns everything
// (for a request that failed before using anything). Exactly one of Settle
// and Cancel counts.
//
// A rejection is a *RejectError carrying the exact wait, RetryAfter =
// (n - L)/ρ from the bucket state, which RetryAfterSeconds turns into the
// Retry-After header's whole seconds (rounded up, at least 1). A cost above
// a bucket's capacity can never be admitted: its RejectError has Oversize
// set, matches ErrExceedsCapacity and has no RetryAfter.
//
// Wait mode (ReserveAt) answers "send now, send at t, or not in time":
// it reserves at once for the earliest time the cost is covered, and
// refuses without reserving when that is further away than the caller can
// wait.
//
// Limits are passed with every call, because they live on the key record;
// the Limiter follows changes without minting tokens.
//
// # Guarantees
//
//   - Exact: the arithmetic is integer fixed point; the worked example and
//     the wait-mode cases of docs/contract.md hold to the digit and nothing
//     drifts.
//   - Bounded: admitted cost in any window of length t is at most
//     C + ρ·t per key and dimension (plus overruns charged after the fact).
//   - Concurrent: a Limiter and its Reservations are safe for concurrent
//     use; keys are spread over lock shards; no decision takes a global lock.
//   - Bounded memory: a key whose buckets are full again holds no state; it
//     is dropped at its shard's next sweep.
//   - Time comes only from the Clock, read once per Reserve; settling a
//     refund reads no clock at all.
//
// # Leased mode
//
// With WithLeases, a key's budget is global, held by an allocator; the
// Limiter admits only what it was granted. Its lease rules are one pure
// core (spender/internal/lease) that takes the time as an input and does
// no I/O; one goroutine drives it, sending its calls over the LeaseSource
// and sleeping on the Clock until the core next needs it (a DrivingSource,
// such as the simulator, drives it itself through Machine). A Reserve whose lease cannot
// cover its cost waits, on the Clock, for the allocator's answer or the
// slow-path deadline (LeaseTuning), after which the fallback policy
// decides. Close returns the unspent leases. DialAllocator is the network
// LeaseSource; given the members of an allocator cluster it sends each call
// to the leader, following a member's NOT_LEADER answer with the same
// request, and while no member leads the Limiter behaves as in an outage.
//
// # Several clusters
//
// A Router spreads keys over several allocator clusters, each an
// independent allocator with its own ledger: one leased Limiter per
// cluster, every key routed to one cluster by rendezvous hashing of the key
// over the cluster names (Route, the same on every gateway). A cluster's
// loss affects only its keys; ReserveAll over budgets on several clusters
// stays all or nothing by cancelling what the other clusters admitted.
//
// # Caveats
//
//   - Overruns are charged after the fact: a request that uses more than it
//     reserved drives its key below zero, and the key's next requests wait
//     the debt off. The bound holds plus those overruns.
//   - Leased, the bound is C + ρ·(t + TTL) per key and dimension (C + ρ·t in
//     the allocator's strict mode), plus overruns. Admissions under the
//     fallback policy while the allocator is unreachable are outside it:
//     the policy bounds them (docs/leasing.md).
//   - A leased Limiter's Status is an estimate: it misses what other
//     spenders spent since the allocator's last answer.
//   - Reservations still outstanding at Close can be settled, but their
//     refunds are not returned to the allocator.
//   - The lease protocol is cooperative: it bounds what honest spenders
//     admit, not what a malicious one can do.
//   - Keys are budgets per key ID: two keys never share a bucket. The
//     Limiter does not count concurrent requests (in-flight limits are a
//     separate concern).
package spender
