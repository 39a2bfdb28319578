package allocator

import (
	"errors"

	"github.com/rationhq/ration/allocator/cluster"
	"github.com/rationhq/ration/allocator/ledger"
)

// Errors returned by the Ledger's calls, matched with errors.Is. The
// connect service maps each to a code through one table (codeOf in
// service.go, docs/allocator.md "Errors").
var (
	// ErrInvalidArgument: a malformed request, wrapped in an *InputError
	// naming the field. Nothing changes.
	ErrInvalidArgument = ledger.ErrInvalidArgument
	// ErrStaleSequence: a sequence below the latest applied. Nothing changes.
	ErrStaleSequence = ledger.ErrStaleSequence
	// ErrSequenceReused: the latest sequence with another body or method.
	ErrSequenceReused = ledger.ErrSequenceReused
	// ErrStaleEpoch: an epoch below the spender's latest. Nothing changes.
	ErrStaleEpoch = ledger.ErrStaleEpoch
	// ErrEpochReleased: a call in an epoch Release has closed.
	ErrEpochReleased = ledger.ErrEpochReleased
	// ErrForeignSpender: a call under a spender id another credential's
	// session holds (until it is released). Nothing changes.
	ErrForeignSpender = ledger.ErrForeignSpender
	// ErrResourceExhausted: the call would take its credential beyond its
	// quota (WithQuota), wrapped in a *QuotaError. Nothing changes.
	ErrResourceExhausted = ledger.ErrResourceExhausted

	// ErrClosed is returned after Close.
	ErrClosed = errors.New("allocator: ledger closed")

	// ErrNotDurable is returned when the store could not commit a call's
	// effects. The effects stay in memory and are committed with a later
	// call; a retry of the same call is answered only once they are durable.
	ErrNotDurable = errors.New("allocator: store commit failed")

	// ErrNotLeader is wrapped by a *NotLeaderError: a replicated Ledger
	// that is not its cluster's leader applies no call.
	ErrNotLeader = cluster.ErrNotLeader

	// ErrOutcomeUnknown: a replicated Ledger proposed the call but could
	// not learn whether it was committed (it lost its leadership, or shut
	// down, with the call in flight). It may yet be applied. Retry the same
	// call (same spender, epoch, sequence and body) at the leader: the
	// exactly-once record answers it from the stored reply if it was
	// applied, and it is applied once otherwise.
	ErrOutcomeUnknown = cluster.ErrOutcomeUnknown

	// ErrClockBehind: a replicated Ledger's leader whose clock is further
	// behind the latest instant its ledger applied than it may wait for
	// (the raft election timeout) refused the call. Nothing was proposed;
	// retry the same call (later, or at the next leader).
	ErrClockBehind = errors.New("allocator: the leader's clock is behind the ledger's latest instant")
	// ErrNotReplicated: a cluster operation (RestoreBackup) on a Ledger
	// that is not a cluster member.
	ErrNotReplicated = errors.New("allocator: not a cluster member")
)

// NotLeaderError is a replicated Ledger's answer on a member that is not
// the leader. Nothing was applied unless Unknown is set. It wraps
// ErrNotLeader, and ErrOutcomeUnknown when Unknown is set.
type NotLeaderError struct {
	// Leader is the leader's lease API base URL, "" while this member
	// knows no leader (or has no URL for it).
	Leader string
	// Unknown reports that this member was the leader when it proposed
	// the call and lost its leadership before learning the outcome: the
	// call may yet be applied (see ErrOutcomeUnknown).
	Unknown bool
}

// Error returns "allocator: not the leader (leader at <url>)", saying when
// the outcome is unknown.
func (e *NotLeaderError) Error() string {
	s := "allocator: not the leader"
	if e.Leader != "" {
		s += " (leader at " + e.Leader + ")"
	} else {
		s += " (leader unknown)"
	}
	if e.Unknown {
		s += "; leadership lost with the call in flight, which may still be applied"
	}
	return s
}

// Unwrap returns ErrNotLeader, and ErrOutcomeUnknown when Unknown is set.
func (e *NotLeaderError) Unwrap() []error {
	if e.Unknown {
		return []error{ErrNotLeader, ErrOutcomeUnknown}
	}
	return []error{ErrNotLeader}
}
