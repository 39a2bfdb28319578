package spender

import (
	"errors"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

// A DrivingSource is a LeaseSource that moves the lease machine of the
// Limiter built on it itself, instead of the Limiter's goroutine: the
// simulator does, to carry each allocator call over its simulated network
// under virtual time. New calls Drive once, with the Limiter's Machine,
// and starts no goroutine; the source's Release is still what Close
// calls. The machine is the one a leased Limiter always runs; only who
// moves it differs.
type DrivingSource interface {
	LeaseSource
	Drive(*Machine)
}

// ErrAttemptTimedOut is matched (errors.Is) by the failure of an attempt
// whose reply its driver stopped waiting for after the Machine's
// AttemptTimeout: the allocator may only be slow, so the machine does not
// count it as unreachable until the call has gone unanswered for the
// slow-path deadline plus the call timeout.
var ErrAttemptTimedOut = errors.New("attempt timed out")

// Machine is a leased Limiter's lease machine as a DrivingSource moves
// it. Its methods read the Limiter's Clock for the time; none of them
// blocks. One goroutine at a time moves it (NextCall, Deliver,
// DeliverAhead, Tick); Reserve and ReserveAll may run beside it.
type Machine struct{ d *driver }

// Wait is a Reserve waiting for the allocator: it asks again with the
// Wait once the next call has been delivered, or at its Deadline, when
// the fallback policy decides. Asked again, Reserve returns the same Wait
// while nothing changed for it.
type Wait struct {
	w  *waiter
	at time.Time
}

// Deadline is when the wait ends and the fallback policy decides.
func (w *Wait) Deadline() time.Time { return w.at }

func (m *Machine) now() bucket.Instant { return m.d.l.now() }

// wait is next as a Wait, nil for none: prev itself if nothing changed
// since prev (the same waiter, the same deadline).
func (m *Machine) wait(prev *Wait, next *waiter) *Wait {
	if next == nil {
		return nil
	}
	at := m.d.l.timeOf(next.deadline)
	if prev != nil && prev.w == next && prev.at.Equal(at) {
		return prev
	}
	return &Wait{next, at}
}

// Reserve is the Limiter's Reserve (ahead false) or ReserveAt (ahead true)
// without waiting: the reservation and the time to send, or an error, or,
// when the allocator must be asked first, a Wait to ask again with. w is
// nil on the first ask.
func (m *Machine) Reserve(key string, lim ration.Limits, c ration.Amount, maxWait time.Duration, ahead bool, w *Wait) (Reservation, time.Time, *Wait, error) {
	var prev *waiter
	if w != nil {
		prev = w.w
	}
	r, at, next, err := m.d.l.reserveLeased(m.now(), key, lim, c, maxWait, ahead, prev)
	if next != nil {
		return nil, time.Time{}, m.wait(w, next), nil
	}
	return r, at, nil, err
}

// ReserveAll is the Limiter's ReserveAll without waiting, with the same
// rules (the charges checked, then all or nothing): the reservations, or
// an error, or a Wait to ask again with, as Reserve does.
func (m *Machine) ReserveAll(charges []Charge, w *Wait) (*Reservations, *Wait, error) {
	if err := checkCharges(charges); err != nil {
		return nil, nil, err
	}
	var prev *waiter
	if w != nil {
		prev = w.w
	}
	rs, next, err := m.d.l.reserveAllLeased(m.now(), charges, prev)
	if next != nil {
		return nil, m.wait(w, next), nil
	}
	if err != nil {
		return nil, nil, err
	}
	return rs, nil, nil
}

// NextCall returns the call to send now, or nil. Only one call is
// outstanding at a time: after a failed attempt NextCall returns the same
// call again once its backoff has passed.
func (m *Machine) NextCall() *LeaseCall { return m.d.lz.nextCall(m.now()) }

// Deliver hands the machine the answer to c's attempt (an Acquire), or
// its failure (err).
func (m *Machine) Deliver(c *LeaseCall, resp *leasev1.AcquireResponse, err error) {
	m.d.lz.deliverAcquire(m.now(), c, resp, err)
}

// DeliverAhead hands the machine the answer to c's attempt (a
// ReserveAhead), or its failure (err).
func (m *Machine) DeliverAhead(c *LeaseCall, resp *leasev1.ReserveAheadResponse, err error) {
	m.d.lz.deliverAhead(m.now(), c, resp, err)
}

// Tick runs the machine's maintenance if it is due.
func (m *Machine) Tick() { m.d.lz.tick(m.now()) }

// AttemptTimeout is how long the machine's driver waits for one attempt's
// reply before it delivers a failure matching ErrAttemptTimedOut.
func (m *Machine) AttemptTimeout() time.Duration { return m.d.lz.attemptTimeout() }

// NextWake is when the machine next needs NextCall or Tick: the end of a
// batching window, a resend, or maintenance.
func (m *Machine) NextWake() time.Time { return m.d.l.timeOf(m.d.lz.nextWake(m.now())) }

// MachineCounts is what a Machine has done, as its Limiter's Metrics
// count it.
type MachineCounts struct {
	KeysHeld           int           // keys holding a lease, a share, something to report or a call, at the last maintenance
	FallbackAdmissions int64         // admitted under the fallback policy
	ShareAccrued       ration.Amount // credited to leases by refill shares
}

// Counts returns what the machine has done so far.
func (m *Machine) Counts() MachineCounts {
	n := MachineCounts{KeysHeld: int(m.d.lz.keysHeld.Load())}
	for i := range m.d.l.shards {
		sh := &m.d.l.shards[i]
		sh.mu.Lock()
		n.FallbackAdmissions += sh.fallbackAdmits
		n.ShareAccrued = n.ShareAccrued.Add(sh.accrued)
		sh.mu.Unlock()
	}
	return n
}

// Acquire is the call's body if it is an Acquire, nil otherwise.
func (c *LeaseCall) Acquire() *leasev1.AcquireRequest { return c.acquire }

// Ahead is the call's body if it is a ReserveAhead, nil otherwise.
func (c *LeaseCall) Ahead() *leasev1.ReserveAheadRequest { return c.ahead }

// Method is the call's RPC name: "Acquire" or "ReserveAhead".
func (c *LeaseCall) Method() string { return c.method() }
