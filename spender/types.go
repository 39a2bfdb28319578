package spender

import (
	"time"

	"github.com/rationhq/ration"
)

// Status is a key's budget as a client should see it, taken right after a
// reservation (or a rejection). A dimension with limit 0 is unlimited and
// its other fields are 0.
type Status struct {
	LimitRequests     int64         // request bucket capacity (the RPM, or its burst)
	RemainingRequests int64         // whole requests left, rounded down, at least 0
	LimitTokens       int64         // token bucket capacity (the TPM, or its burst)
	RemainingTokens   int64         // whole tokens left, rounded down, at least 0
	ResetTokens       time.Duration // until the token bucket is full again
	ResetRequests     time.Duration // until the request bucket is full again
}

// Dimension names one of a key's two budgets.
type Dimension uint8

const (
	// Requests is the requests-per-minute budget.
	Requests Dimension = iota + 1
	// Tokens is the tokens-per-minute budget.
	Tokens
)

// String returns "requests" or "tokens".
func (d Dimension) String() string {
	switch d {
	case Requests:
		return "requests"
	case Tokens:
		return "tokens"
	}
	return "unknown"
}

// Reservation is an admitted cost, held until the response is known.
// Exactly one of Settle and Cancel counts; later calls of either do
// nothing. A Reservation is safe for concurrent use.
type Reservation interface {
	// Settle charges the actual usage: the difference from the reserved
	// cost is refunded (capped at capacity) or, for an overrun, taken
	// even below zero, a debt the key's next requests wait off.
	// Negative actual values count as 0.
	Settle(actual ration.Amount)
	// Cancel returns the whole reserved cost, as if the request never ran.
	Cancel()
	// Status returns the key's budget right after this reservation.
	Status() Status
}
