package lease

import "time"

// Tuning is a leased Limiter's timing knobs (spender.LeaseTuning, whose
// doc says what each means and its range).
type Tuning struct {
	SlowPathDeadline    time.Duration
	BatchWindow         time.Duration
	Horizon             time.Duration
	MaintenanceInterval time.Duration
	CallTimeout         time.Duration
}

// Policy is what a key without a usable lease gets while the allocator is
// unreachable (spender.FallbackPolicy, whose doc says what each does).
type Policy uint8

const (
	FallbackShare Policy = iota // a local bucket pair at the spender's part of the key's limits
	FailClosed                  // refuse
	FailOpen                    // admit
)

// Env is what a key's rules read of the whole machine: the timing knobs,
// the lease TTL the allocator last answered with (0 before any answer),
// how long before a lease runs out a refresh should start, and whether
// the allocator counts as unreachable.
type Env struct {
	Tuning   Tuning
	TTL      time.Duration
	Lead     time.Duration
	Fallback bool
}
