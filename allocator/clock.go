package allocator

import "time"

// Clock tells the time. The ledger reads it once per call; tests and the
// simulator pass a virtual clock.
type Clock interface {
	Now() time.Time
}

// SystemClock is the real clock, time.Now.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }
