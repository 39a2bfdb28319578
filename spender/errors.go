package spender

import (
	"errors"
	"fmt"
	"time"

	"github.com/rationhq/ration"
)

var (
	// ErrRateLimited is matched (errors.Is) by every *RejectError that a
	// later retry can satisfy: the budget is short now and RetryAfter says
	// for how long.
	ErrRateLimited = errors.New("spender: rate limited")

	// ErrExceedsCapacity is matched (errors.Is) by a *RejectError whose
	// cost can never be admitted: it is above the bucket's capacity in
	// some dimension. Retrying does not help; RetryAfter is 0.
	ErrExceedsCapacity = errors.New("spender: cost exceeds capacity")

	// ErrInvalidKey is returned when a key is empty or longer than MaxKeyLen.
	ErrInvalidKey = errors.New("spender: invalid key")

	// ErrInvalidCost is returned when a cost has a negative field.
	ErrInvalidCost = errors.New("spender: invalid cost")

	// ErrInvalidCharges is returned by ReserveAll for no charges, more
	// than ration.MaxBudgets, or one key charged twice.
	ErrInvalidCharges = errors.New("spender: invalid charges")

	// ErrKeyRejected is returned for a key whose entry the allocator
	// refused as invalid (the rest of its lease call went on). The error
	// names the key and the allocator's reason. The key is not asked for
	// again until its limits change or it is forgotten as idle.
	ErrKeyRejected = errors.New("spender: the allocator rejected the key")

	// ErrAllocatorUnreachable is returned by Ready while the allocator
	// does not serve the Limiter, with the cause: its calls fail (three
	// attempts, or for the slow-path deadline), a request waited for it as
	// long as it may, or it refused a call outright. Meanwhile the Limiter
	// admits by its fallback policy. It lasts until one of its answers
	// arrives.
	ErrAllocatorUnreachable = errors.New("spender: allocator unreachable")

	// ErrCredentialRefused is matched by the error Ready returns while the
	// allocator refuses this spender's credential (connect's
	// Unauthenticated or PermissionDenied: a missing, wrong or revoked
	// token), and by the error of a Reserve that needs the allocator then
	// (a valid lease is still spent). The error carries the allocator's
	// answer. Calls are retried with backoff, so a credential the
	// allocator accepts again ends it.
	ErrCredentialRefused = errors.New("spender: the allocator refused this spender's credential")

	// ErrDuplicateSpender is returned by Ready and Close of a leased
	// Limiter that found another live process using its spender id: the
	// allocator moved the id to a newer epoch while this one's calls were
	// being answered. The Limiter stops calling the allocator (taking the
	// id back would make the two take turns refusing each other) and
	// serves its leases, then its fallback policy, until it is closed.
	ErrDuplicateSpender = errors.New("spender: another live process uses this spender id")

	// ErrSpenderRefused is returned by Ready and Close of a leased Limiter
	// whose epoch the allocator refuses: more than a day past the
	// allocator's clock (ration.MaxEpochAhead), read as nanoseconds since
	// the Unix epoch. The Limiter stops calling the allocator, as for
	// ErrDuplicateSpender.
	ErrSpenderRefused = errors.New("spender: the allocator refuses this spender's epoch")

	// ErrClosed is returned by Flush and by the calls of a leased Limiter
	// after Close.
	ErrClosed = errors.New("spender: limiter closed")
)

// RejectError is returned when a cost is not admitted. It never reserves
// anything.
//
// When the budget is merely short, RetryAfter is the exact wait until the
// cost is covered in every dimension (computed from the bucket state, not a
// constant) and the error matches ErrRateLimited. When the cost can never
// fit (it is above a bucket's capacity), Oversize is true, RetryAfter is 0
// and the error matches ErrExceedsCapacity.
type RejectError struct {
	RetryAfter time.Duration // exact wait until the cost is covered; 0 when Oversize
	Status     Status        // the key's budget at the rejection
	Dimension  Dimension     // the budget that was short (the longer wait when both were)
	Oversize   bool          // the cost exceeds the capacity of Dimension and can never be admitted
	Cost       ration.Amount // the cost that was asked for
	Key        string        // ReserveAll: the budget that refused (the one that waits longest); "" for Reserve
}

// Error describes which budget ran out and when to come back.
func (e *RejectError) Error() string {
	on := ""
	if e.Key != "" {
		on = fmt.Sprintf(" of budget %q", e.Key)
	}
	if e.Oversize {
		return fmt.Sprintf("spender: cost of %d %s exceeds the limit%s of %d per minute and can never be admitted",
			e.dimCost(), e.Dimension, on, e.dimLimit())
	}
	return fmt.Sprintf("spender: rate limited on %s%s: %d requested, %d remaining; retry after %v",
		e.Dimension, on, e.dimCost(), e.dimRemaining(), e.RetryAfter)
}

// Unwrap returns ErrExceedsCapacity or ErrRateLimited.
func (e *RejectError) Unwrap() error {
	if e.Oversize {
		return ErrExceedsCapacity
	}
	return ErrRateLimited
}

func (e *RejectError) dimCost() int64 {
	if e.Dimension == Requests {
		return e.Cost.Requests
	}
	return e.Cost.Tokens
}

func (e *RejectError) dimLimit() int64 {
	if e.Dimension == Requests {
		return e.Status.LimitRequests
	}
	return e.Status.LimitTokens
}

func (e *RejectError) dimRemaining() int64 {
	if e.Dimension == Requests {
		return e.Status.RemainingRequests
	}
	return e.Status.RemainingTokens
}

// RetryAfterSeconds converts a wait to the Retry-After header's whole
// seconds: rounded up, so a client never comes back before the budget
// exists, and at least 1, so a sub-second wait does not read "retry now".
func RetryAfterSeconds(d time.Duration) int {
	if d <= time.Second {
		return 1
	}
	s := d / time.Second
	if d%time.Second != 0 {
		s++
	}
	if s > 1<<31-1 {
		return 1<<31 - 1
	}
	return int(s)
}
