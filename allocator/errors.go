package allocator

import (
	"errors"

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

	// ErrClosed is returned after Close.
	ErrClosed = errors.New("allocator: ledger closed")

	// ErrNotDurable is returned when the store could not commit a call's
	// effects. The effects stay in memory and are committed with a later
	// call; a retry of the same call is answered only once they are durable.
	ErrNotDurable = errors.New("allocator: store commit failed")
)
