// Package leasedrive lets a spender.LeaseSource drive a leased Limiter's
// lease state machine itself, instead of the Limiter's own goroutine: the
// simulator does, to carry each allocator call over its simulated network
// under virtual time. The machine is the one a leased Limiter always runs;
// only who moves it differs. It is internal: a gateway has no use for it.
package leasedrive

import (
	"errors"
	"time"

	"github.com/rationhq/ration"
)

// ErrTimedOut is matched (errors.Is) by the failure a driver delivers when
// it stopped waiting for an attempt's reply after AttemptTimeout: the
// allocator may only be slow, so the machine does not count it as
// unreachable until the call has gone unanswered for the slow-path
// deadline plus the call timeout.
var ErrTimedOut = errors.New("attempt timed out")

// Source is a spender.LeaseSource that drives the machine. spender.New
// calls Drive once, with the new Limiter's machine, and starts no
// goroutine; the Source's Release is still what Close calls.
type Source interface {
	Drive(Machine)
}

// Machine is a leased Limiter's lease state machine. Its methods read the
// Limiter's Clock for the time; none of them blocks.
type Machine interface {
	// Reserve is the Limiter's Reserve (ahead false) or ReserveAt (ahead
	// true) without waiting: the reservation (a spender.Reservation) and
	// the time to send, or an error, or, when the allocator must be asked
	// first, a Wait to ask again with once the next call has been
	// delivered or at the Wait's deadline. w is nil on the first ask.
	Reserve(key string, lim ration.Limits, c ration.Amount, maxWait time.Duration, ahead bool, w Wait) (r any, at time.Time, next Wait, err error)
	// ReserveAll is the Limiter's ReserveAll without waiting: a request
	// charged to several budgets, all or nothing. It returns the
	// reservations (a *spender.Reservations, one per charge in order), or
	// an error (a *spender.RejectError naming the budget that refused, or
	// bad charges), or, when the allocator must be asked first, a Wait to
	// ask again with, as Reserve does. w is nil on the first ask.
	ReserveAll(charges []Charge, w Wait) (r any, next Wait, err error)
	// NextCall returns the call to send now, or nil. Only one call is
	// outstanding at a time: after a failed attempt NextCall returns the
	// same call again once its backoff has passed.
	NextCall() Call
	// Deliver hands the machine the answer to c's attempt (resp is the
	// *AcquireResponse or *ReserveAheadResponse), or its failure (err).
	Deliver(c Call, resp any, err error)
	// AttemptTimeout is how long the machine's driver waits for one
	// attempt's reply before it delivers a failure matching ErrTimedOut.
	AttemptTimeout() time.Duration
	// Tick runs the machine's maintenance if it is due.
	Tick()
	// NextWake is when the machine next needs NextCall or Tick: the end of
	// a batching window, a resend, or maintenance.
	NextWake() time.Time
}

// Charge is one budget a ReserveAll charges, with spender.Charge's
// fields and meaning: the budget's key, its limits and what the request
// costs it. (This package cannot name spender's type: spender imports it.)
type Charge struct {
	Key    string
	Limits ration.Limits
	Cost   ration.Amount
}

// Wait is a Reserve waiting for the allocator.
type Wait interface {
	// Deadline is when the wait ends and the fallback policy decides.
	Deadline() time.Time
}

// Call is one allocator call.
type Call interface {
	// Request is the body: an *AcquireRequest or *ReserveAheadRequest.
	Request() any
	// Method is the RPC's name: "Acquire" or "ReserveAhead".
	Method() string
}
