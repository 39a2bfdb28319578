// Package allocator is ration's central service: it owns every API key's
// global RPM and TPM budget and hands it out to spenders in leases.
//
// The state lives in package ledger, a pure state machine: one global
// token bucket per key and limited dimension (the shared bucket package,
// Instants in microseconds since the Unix epoch), the holdings of every
// spender incarnation per key with their expiries, and each spender's
// exactly-once record, changed only by applying commands that carry their
// instant. This package runs it: a [Ledger] applies each call through its
// store, the one part that differs between its kinds: memory ([New]: a
// ledger.State behind a mutex, applied at the clock's now), the bbolt
// journal ([Open]: the same, answering once the records the call changed
// are durable, with group commit, checkpoints and recovery) or the raft
// log ([NewReplicated]: a [Member] of a cluster, package cluster, whose
// leader applies each call through the replicated log). An option a kind
// of Ledger has no use for is an error naming it. [Service] adapts a
// Ledger to the connect LeaseService (Connect, gRPC and gRPC-Web) and is
// also the in-process entry point: it implements
// leasev1connect.LeaseServiceHandler, whose method set is the same as the
// generated client's, so a spender can be handed either.
//
// The ledger's types (ledger.Caller, ledger.AcquireKey, the replies,
// ledger.Policy, ledger.Quota, ...) and its errors (ledger.ErrInvalidArgument,
// ledger.ErrStaleEpoch, ...) have one door, package ledger; a cluster's
// (cluster.NotLeaderError, cluster.ErrOutcomeUnknown), package cluster.
// This package has the shell's: the Ledger, its options and errors, the
// Service, Mount, auth and metrics.
//
// # Guarantees
//
//   - Every unit granted was taken from the key's global bucket; grants
//     never take a bucket below zero (a reservation ahead and reported
//     debt may).
//   - Returns are credited only up to what the caller holds on the key
//     (invariant 3); holdings stop counting at their expiry.
//   - Level plus holdings never exceed C + rho*TTL per dimension (C in
//     strict mode): refill beyond that is burned. This closes the one hole
//     in "grants follow the bucket": tokens returned and regranted before
//     they expire would otherwise accumulate past the bound. With it,
//     admissions in any window t stay within C + rho*(t + TTL) plus
//     outstanding debt (C + rho*t in strict mode); docs/bound.md has the proof.
//   - Calls of one (spender, epoch) apply in sequence order, each once; a
//     retry of the latest gets the stored reply (invariant 4).
//   - A durable ledger ([Open]) answers a call only after a bbolt commit
//     covering it has been synced; what is on disk is always the state
//     after a prefix of the applied calls, so after kill -9 the ledger
//     resumes exactly. A record it cannot decode or validate starts empty.
//   - A replicated Ledger ([NewReplicated]) answers a call only after the
//     log entry holding it is committed by a majority of the cluster and
//     applied on the member, so a granted lease survives the loss of any
//     minority of members. Only the leader applies calls; another member
//     answers a *cluster.NotLeaderError naming the leader's API URL,
//     having applied nothing. A call whose outcome the leader could not
//     learn (cluster.ErrOutcomeUnknown) is retried, the same call, at the
//     new leader: the exactly-once records are replicated, so it is
//     applied once.
//   - A call whose context ends while it waits for its commit returns at
//     once with an *[AbandonedError] saying whether it was applied (the
//     journal: yes, durable with a later commit), not applied (a cluster
//     call still queued) or unknown (a cluster call already proposed); a
//     call whose context has ended is not applied. The same call sent
//     again is applied once.
//   - Bad input is rejected with a *ledger.InputError naming the field,
//     before anything changes.
//
// # Caveats
//
//   - One mutex serialises all calls. Each key costs a few hundred
//     nanoseconds, so a single node handles millions of key-grants per
//     second; shard keys over allocators for more.
//   - A spender must keep at most one call in flight: a call overtaken by
//     a later sequence is refused as stale.
//   - A session (exactly-once record) is forgotten after the retention
//     (WithSessionRetention, default 1 h, at least 2 TTL) of inactivity; a
//     retry older than that would be applied again. Holdings also record
//     the last sequence applied per key, which stops most such repeats.
//   - A key whose stored state was lost keeps its "empty" marker in memory
//     until its next call (its limits are unknown until then).
//   - The bound relies on spenders reporting Held and Returned honestly;
//     like Doorman, the protocol is cooperative, not adversarial.
package allocator
