package ration

import (
	"fmt"
	"time"
	"unicode/utf8"
)

// The lease protocol's bounds. The allocator refuses a call outside them,
// so the spender and the keys file enforce the same numbers where the
// input enters: a key every part accepts, or a clear error at the edge.
const (
	MaxKeyLen       = 256                // bytes in a key id
	MaxSpenderIDLen = 128                // bytes in a spender id
	MaxBatch        = 1024               // keys in one lease call
	MaxRate         = 1_000_000_000_000  // requests or tokens per minute, and bursts
	MaxAmount       = 1 << 50            // requests or tokens in any amount of a call
	MaxWait         = time.Hour          // the longest wait a wait-mode reservation may ask for
	MaxBudgets      = 16                 // budgets one request may be charged to
	MaxWindow       = 7 * 24 * time.Hour // the longest window a limit's rates may be per (Limits.Window)
	// MaxEpochAhead is how far an epoch may be past the allocator's clock,
	// read as nanoseconds since the Unix epoch (a spender's default epoch
	// is its start time so read): any id's epoch stays within reach of
	// its next incarnation.
	MaxEpochAhead = 24 * time.Hour
)

// ValidKey reports whether id can name a key everywhere in ration: 1 to
// MaxKeyLen bytes of valid UTF-8 (the lease protocol carries key ids as
// protobuf strings). The error says what is wrong; it does not echo id.
func ValidKey(id string) error {
	return validID("key id", id, MaxKeyLen)
}

// ValidSpenderID reports whether id can name a spender to the allocator:
// 1 to MaxSpenderIDLen bytes of valid UTF-8.
func ValidSpenderID(id string) error {
	return validID("spender id", id, MaxSpenderIDLen)
}

func validID(what, id string, maxLen int) error {
	switch {
	case id == "":
		return fmt.Errorf("%s is empty", what)
	case len(id) > maxLen:
		return fmt.Errorf("%s is %d bytes, at most %d", what, len(id), maxLen)
	case !utf8.ValidString(id):
		return fmt.Errorf("%s is not valid UTF-8", what)
	}
	return nil
}
