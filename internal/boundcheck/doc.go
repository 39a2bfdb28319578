// Package boundcheck is a model of spenders that follow the lease protocol
// and the checks a ledger must pass under them, for property tests of the
// allocator, on one process or replicated.
//
// A Model drives model spenders over a few fixed keys (Keys, with lease
// time to live TTL) on a manual clock: they acquire and reserve ahead,
// return and report what they hold, take refill shares and accrue them by
// the spender's rules (rounded down, paused while a call carrying the key
// is in flight, carried fraction, burst), admit from their pools, overrun
// as debt, release and restart. Their calls reach the ledger under test
// through a Ledger, which the test implements (a lossy network, restarts,
// a cluster with faults); the model only uses what replies told it.
//
// Model.Check verifies the over-admission bound of docs/bound.md for every
// key, dimension and window ending now: admitted in the window plus what
// spenders could still admit at its end is at most C + rho*(t + TTL)
// (C + rho*t in strict mode) plus the debt reported. Every fresh reply is
// checked for returns that mint: a credited return is at most the holding
// the previous reply reported (grown by its share since, and 0 once
// expired). A retried call must get the stored reply.
//
// Choices are drawn from a T: a pgregory.net/rapid T behind an adapter, or
// a seeded source, so that the same seed gives the same calls. The package
// is for tests only; nothing in it is safe for concurrent use.
package boundcheck
