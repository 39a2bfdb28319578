// Package lease is the lease core of a leased spender.Limiter: every rule
// of the leased path, pure, typed and single-threaded. It takes the time as
// a value (bucket.Instant), reads no clock, does no I/O, and holds no lock,
// atomic, channel, logger, metric, RPC or wire type (TestImportsNoShell
// checks its imports). The spender is its driver: it owns the concurrency,
// sends the calls, converts them to and from the protocol's messages, wakes
// the Reserves waiting on a call, logs and counts.
//
// It has two parts.
//
// Key is one key's lease: the lease itself (avail, expiry, generation),
// what is admitted and not settled, what the key owes and gives back, its
// refill share, its spend-rate and demand estimates, the wait the
// allocator named, and its fallback buckets. Its rules are Env's and Key's
// methods: Judge and Admit (a Reserve), Refuse, Ask, FallbackCheck and
// FallbackAdmit, Aheaded (a reservation ahead answered), Settle,
// SettleAhead and SettleFallback (a settlement), Entry (the key's part of
// an Acquire) and Apply (the allocator's Grant for it), Scan (maintenance)
// and Release (Close). Env is what they read of the whole machine: the
// timing knobs, the lease TTL, the lead, whether the allocator counts as
// unreachable.
//
// Calls is the call machine: which call to send and when (Queue, Ahead,
// Urge, Next: a Call with its Caller), what the answer or the failure of
// an attempt means (Answered; Failed, whose Outcome says resend, drop, take
// one entry out, start a new epoch or stop), when maintenance is due
// (Tick), when the machine next needs to run (NextWake), how long an
// attempt may take (AttemptTimeout), and the Env the keys' rules read.
//
// # Who owns what
//
// A Key belongs to its key's state in the Limiter, and every field of it
// is read and written only under that key's shard lock: by the admit path
// (Judge, Admit, Refuse, Ask, the fallback, Aheaded and the settlements, on
// the Reserve's and Settle's goroutines) and by the driver (Entry, Apply,
// Scan, Release, and the queued and in-call marks it sets as it builds
// and ends calls). The shard lock is the one writer's lock: no Key
// field is touched without it, and nothing else guards a Key.
//
// Calls belongs to the driver's machine lock (the leaser's mutex, taken
// after a shard lock, never before). The driver's goroutine moves it (Next,
// Answered, Failed, Tick, NextWake); Reserves only queue (Queue, Ahead,
// Urge) and ask whether the call under way has failed (Failing). What the
// admit path reads of it, Env, is published by the driver after each
// change (one atomic pointer in the spender), so that admitting from a
// lease takes only the shard lock.
//
// docs/leasing.md describes the rules; this package is where each of them
// is written, once.
package lease
