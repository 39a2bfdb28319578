// Package fakeclock is a manually advanced clock for tests and examples:
// time moves only when the test says so, so refills are exact and no test
// sleeps.
package fakeclock

import (
	"sync"
	"time"
)

// Epoch returns the instant a new Clock starts at: 2026-01-01T00:00:00Z.
func Epoch() time.Time { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) }

// Clock is a clock that stands still until Advance or Set. The zero value
// reads the zero time; New starts at Epoch(). It is safe for concurrent use.
type Clock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

// New returns a Clock reading Epoch().
func New() *Clock { return &Clock{t: Epoch()} }

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d (backward if d is negative).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}
