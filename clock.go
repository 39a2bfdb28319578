package ration

import "time"

// Clock is where every part of ration reads the time and waits for it.
// The system clock is SystemClock; tests and the simulator pass a virtual
// one, so that refills, lease expiries and retries follow their time.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed on this
	// clock (at once when d <= 0), unless the returned Timer is stopped
	// first.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call if it has not started and reports whether it
	// did.
	Stop() bool
}

// SystemClock is the real clock: time.Now and time.AfterFunc.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// AfterFunc is time.AfterFunc.
func (SystemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
