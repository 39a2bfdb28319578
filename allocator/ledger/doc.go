// Package ledger is the allocator's state machine: every API key's global
// token buckets and the holdings of every spender incarnation, and every
// spender's exactly-once session.
//
// It is pure and deterministic. A [Command] ([Acquire], [ReserveAhead],
// [Release] or [Sweep]) carries the instant it applies at; [State.Apply]
// validates it (bad input is an [*InputError] naming the field, and
// nothing changes), runs the exactly-once check, applies it and returns
// the reply and the names of the records it changed ([Changes]);
// [State.AppendRecords] encodes those records for a store. The same state
// and the same commands at the same instants give the same replies,
// records and state, byte for byte. Nothing here reads a clock, takes a lock or touches a
// file: package allocator runs a State behind a mutex at the clock's now
// and persists the changed records (its store); a replicated allocator
// would apply the same commands on every replica.
//
// A [Record] is the encoded state of one key or one session; [State.Load]
// reads one back (a record that fails to decode is not vouched for: its
// key starts empty), and [State.Snapshot] and [Restore] write and read the
// whole state as one batch of records.
//
// The guarantees the ledger keeps are in the allocator package's
// documentation and docs/allocator.md; the bound they give is proved in
// docs/bound.md.
package ledger
