// Package fakeclock is a manually advanced clock for tests and examples:
// time moves only when the test says so, so refills are exact and no test
// sleeps.
package fakeclock

import (
	"slices"
	"sync"
	"time"

	"github.com/rationhq/ration"
)

// Epoch returns the instant a new Clock starts at: 2026-01-01T00:00:00Z.
func Epoch() time.Time { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) }

// Clock is a ration.Clock that stands still until Advance or Set. The zero
// value reads the zero time; New starts at Epoch(). It is safe for
// concurrent use.
//
// AfterFunc callbacks run synchronously inside the Advance or Set that
// reaches their time, in the order of their due times, after the clock
// has moved (the clock's lock is not held while they run).
type Clock struct {
	mu     sync.Mutex // guards t and timers
	t      time.Time
	timers []*timer
}

var _ ration.Clock = (*Clock)(nil)

// New returns a Clock reading Epoch().
func New() *Clock { return &Clock{t: Epoch()} }

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d (backward if d is negative) and
// runs the callbacks that are due.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
	c.fire()
}

// Set moves the clock to t and runs the callbacks that are due.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
	c.fire()
}

// AfterFunc schedules f for d from the clock's now; with d <= 0 it runs f
// in its own goroutine at once, as time.AfterFunc does.
func (c *Clock) AfterFunc(d time.Duration, f func()) ration.Timer {
	tm := &timer{c: c, f: f}
	if d <= 0 {
		go f()
		return tm
	}
	c.mu.Lock()
	tm.at = c.t.Add(d)
	c.timers = append(c.timers, tm)
	c.mu.Unlock()
	return tm
}

// Timers returns the number of callbacks scheduled and not yet run or
// stopped.
func (c *Clock) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// fire runs every due callback, earliest first.
func (c *Clock) fire() {
	for {
		c.mu.Lock()
		i := -1
		for j, tm := range c.timers {
			if !tm.at.After(c.t) && (i < 0 || tm.at.Before(c.timers[i].at)) {
				i = j
			}
		}
		if i < 0 {
			c.mu.Unlock()
			return
		}
		tm := c.timers[i]
		c.timers = slices.Delete(c.timers, i, i+1)
		c.mu.Unlock()
		tm.f()
	}
}

type timer struct {
	c  *Clock
	at time.Time
	f  func()
}

func (tm *timer) Stop() bool {
	c := tm.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, other := range c.timers {
		if other == tm {
			c.timers = slices.Delete(c.timers, i, i+1)
			return true
		}
	}
	return false
}
