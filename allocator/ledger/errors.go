package ledger

import (
	"errors"
	"fmt"
)

// Errors returned by Apply, matched with errors.Is. The allocator package
// re-exports them and maps each to a connect code (codeOf in
// allocator/service.go).
var (
	// ErrInvalidArgument is returned (wrapped in an *InputError that names
	// the field) when a request is malformed: empty or over-long key or
	// spender id, zero epoch or sequence, negative amount, a batch over
	// MaxBatch, a key listed twice, limits out of range. Nothing changes.
	ErrInvalidArgument = errors.New("invalid argument")

	// ErrStaleSequence is returned when a call's sequence is below the
	// latest applied for its (spender, epoch). Nothing changes.
	ErrStaleSequence = errors.New("stale sequence")

	// ErrSequenceReused is returned when a call repeats the latest applied
	// sequence with a different body or method. Nothing changes.
	ErrSequenceReused = errors.New("sequence reused with a different request")

	// ErrStaleEpoch is returned when a call's epoch is below the latest
	// seen for its spender. Nothing changes.
	ErrStaleEpoch = errors.New("stale epoch")

	// ErrEpochReleased is returned for a call in an epoch that Release has
	// closed. Nothing changes.
	ErrEpochReleased = errors.New("epoch released")

	// ErrForeignSpender is returned for a call under a spender id whose
	// session another credential created (and has not released). Nothing
	// changes.
	ErrForeignSpender = errors.New("spender id belongs to another credential")

	// ErrResourceExhausted is returned (wrapped in a *QuotaError) when a
	// call would take its credential beyond Config.Quota. Nothing changes.
	ErrResourceExhausted = errors.New("resource exhausted")
)

// QuotaError is ErrResourceExhausted naming the quota: what the call would
// have raised its credential's count of to beyond the limit.
type QuotaError struct {
	What  string // "sessions", "keys", "leases" or "stored answers"
	Limit int    // the quota
}

// Error returns "<what> of this credential at the quota (N)".
func (e *QuotaError) Error() string {
	return fmt.Sprintf("%v: the call would take this credential's %s beyond its quota of %d", ErrResourceExhausted, e.What, e.Limit)
}

// Unwrap returns ErrResourceExhausted.
func (e *QuotaError) Unwrap() error { return ErrResourceExhausted }

// StaleEpochError is ErrStaleEpoch with the latest epoch the allocator has
// seen for the spender id. A spender that has had no call answered in its
// epoch may start one above it (its predecessor is gone, its clock went
// back); one that has is not the only live process with its id.
type StaleEpochError struct {
	Latest uint64
}

// Error returns "stale epoch (the latest seen is N)".
func (e *StaleEpochError) Error() string {
	return fmt.Sprintf("%v (the latest seen is %d)", ErrStaleEpoch, e.Latest)
}

// Unwrap returns ErrStaleEpoch.
func (e *StaleEpochError) Unwrap() error { return ErrStaleEpoch }

// InputError reports a malformed request. Field names the offending field
// in the protocol's terms (for example "keys[3].want.tokens"); the message
// never echoes an API key.
type InputError struct {
	Field  string // the offending field, protocol names, with indexes
	Reason string // what is wrong with it
}

// Error returns "allocator: <field>: <reason>".
func (e *InputError) Error() string {
	return fmt.Sprintf("allocator: %s: %s", e.Field, e.Reason)
}

// Unwrap returns ErrInvalidArgument.
func (e *InputError) Unwrap() error { return ErrInvalidArgument }

func inputErr(field, format string, args ...any) error {
	return &InputError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
