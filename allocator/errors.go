package allocator

import (
	"errors"

	"github.com/rationhq/ration/allocator/cluster"
)

// Errors of the Ledger's shell, matched with errors.Is; the state
// machine's own (bad input, stale calls, quotas) are package ledger's. The
// connect service maps each to a code through one table (codeOf in
// service.go, docs/allocator.md "Errors").
var (
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("allocator: ledger closed")

	// ErrNotDurable is returned when the store could not commit a call's
	// effects. The effects stay in memory and are committed with a later
	// call; a retry of the same call is answered only once they are durable.
	ErrNotDurable = errors.New("allocator: store commit failed")

	// ErrClockBehind: a replicated Ledger's leader whose clock is further
	// behind the latest instant its ledger applied than it may wait for
	// (the raft election timeout) refused the call. Nothing was proposed;
	// retry the same call (later, or at the next leader).
	ErrClockBehind = errors.New("allocator: the leader's clock is behind the ledger's latest instant")
)

// AbandonedError is a call's answer when its context ended before the
// call was answered: before it was applied, or while it waited for its
// commit, which a call cannot take back. Applied and Unknown say what
// became of it; neither: nothing changed. It wraps the context's error
// (context.Canceled or DeadlineExceeded), and cluster.ErrOutcomeUnknown
// when Unknown. Sent again (same spender, epoch, sequence and body), the
// call is applied once either way.
type AbandonedError struct {
	// Err is the context's error.
	Err error
	// Applied: the ledger applied the call; its effects are in memory and
	// become durable with a later commit. The same call sent again gets
	// the stored reply once they are.
	Applied bool
	// Unknown: a replicated Ledger had proposed the call, which may yet
	// be committed and applied.
	Unknown bool
}

// Error returns "allocator: call abandoned (<ctx error>): <outcome>".
func (e *AbandonedError) Error() string {
	outcome := "not applied"
	switch {
	case e.Applied:
		outcome = "applied, not yet durable"
	case e.Unknown:
		outcome = "proposed, outcome unknown"
	}
	return "allocator: call abandoned (" + e.Err.Error() + "): " + outcome
}

// Unwrap returns Err, and cluster.ErrOutcomeUnknown when Unknown.
func (e *AbandonedError) Unwrap() []error {
	if e.Unknown {
		return []error{e.Err, cluster.ErrOutcomeUnknown}
	}
	return []error{e.Err}
}
