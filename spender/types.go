package spender

import (
	"time"

	"github.com/rationhq/ration/bucket"
)

// Clock tells the time. Every time-dependent decision in this package reads
// it, once per call; tests and the simulator pass a virtual clock.
type Clock interface {
	Now() time.Time
}

// SystemClock is the real clock, time.Now.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// Cost is what one request spends: Requests (usually 1) against the RPM
// budget and Tokens (prompt plus completion) against the TPM budget. Both
// are reserved together or not at all. Negative values are rejected.
type Cost struct {
	Requests int64 // requests, counted against Limits.RPM
	Tokens   int64 // tokens, counted against Limits.TPM
}

// Limits are a key's budgets. A rate of 0 means unlimited: that dimension
// has no bucket, is never rejected and reports no headers. A burst of 0
// means one minute's budget (capacity = the rate), the seed 000 default.
// Limits come with every call because they live on the key record and may
// change when an admin edits the key; the bucket follows the new limits
// without minting tokens.
type Limits struct {
	RPM           int64 // requests per minute; 0 = unlimited
	TPM           int64 // tokens per minute; 0 = unlimited
	BurstRequests int64 // request bucket capacity; 0 = RPM
	BurstTokens   int64 // token bucket capacity; 0 = TPM
}

// RequestLimit returns the bucket for the request dimension and whether it
// is limited at all.
func (l Limits) RequestLimit() (bucket.Limit, bool) { return dimLimit(l.RPM, l.BurstRequests) }

// TokenLimit returns the bucket for the token dimension and whether it is
// limited at all.
func (l Limits) TokenLimit() (bucket.Limit, bool) { return dimLimit(l.TPM, l.BurstTokens) }

func dimLimit(rate, burst int64) (bucket.Limit, bool) {
	if rate == 0 {
		return bucket.Limit{}, false
	}
	capacity := burst
	if capacity == 0 {
		capacity = rate
	}
	return bucket.Limit{Capacity: capacity, Refill: rate, Period: time.Minute}, true
}

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
	Settle(actual Cost)
	// Cancel returns the whole reserved cost, as if the request never ran.
	Cancel()
	// Status returns the key's budget right after this reservation.
	Status() Status
}
