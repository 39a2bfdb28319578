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
)

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
