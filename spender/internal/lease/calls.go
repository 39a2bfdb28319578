package lease

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// Calls is a leased Limiter's call machine: which allocator call to send
// and when, what the answer or the failure of an attempt means, when
// maintenance is due, and whether the allocator counts as unreachable. Its
// inputs carry the time; its outputs are the call to send (Next), what an
// attempt's outcome asks of the driver (Failed's Outcome), the next wake
// (NextWake) and what the keys' rules read of it (Env). It holds no key:
// the driver keeps the queued keys and jobs, in the order it told Calls of
// them (Queue, Ahead), and takes as many as Next says into the call.
//
// Calls are made one at a time, each with a Caller (spender id, epoch,
// sequence); a failed call is sent again with the same sequence and body
// until it is answered, so the allocator applies it exactly once.
type Calls struct {
	tuning Tuning
	id     string
	epoch  uint64
	seq    uint64
	rng    *rand.Rand

	queued   int // keys waiting for the next Acquire
	queuedAt bucket.Instant
	urgent   bool // a Reserve waits on a queued key: skip the batching window
	aheads   int  // reservations ahead waiting for the next ReserveAhead
	call     *Call
	nextTick bucket.Instant // when maintenance runs next
	answered bool           // a call was answered in the current epoch
	stopped  bool           // no more calls (Stop)
	fallback bool           // the allocator counts as unreachable

	rtt    time.Duration // smoothed call latency
	rttMax time.Duration // the slowest recent answer, decaying; 0 until the first answer
	ttl    time.Duration // the lease TTL the allocator last answered with; 0 before
}

// CallKind is an allocator call's RPC.
type CallKind uint8

const (
	Acquire      CallKind = iota + 1 // leases for queued keys
	ReserveAhead                     // reservations ahead for queued jobs (wait mode)
)

// Caller is who makes a call: the spender's id, its epoch, and the call's
// sequence in the epoch.
type Caller struct {
	ID    string
	Epoch uint64
	Seq   uint64
}

// Call is one allocator call's sending state. Its body is the driver's:
// Size keys, taken from the queue when Next made the call.
type Call struct {
	Kind   CallKind
	Size   int    // entries in the body
	Caller Caller // as of this attempt: a new epoch or a key taken out changes it

	sent     bucket.Instant // first send: leases are counted from here
	attempt  bucket.Instant // this attempt's send
	inFlight bool           // handed to the driver, not yet delivered
	resendAt bucket.Instant
	backoff  time.Duration
	fails    int // attempts that failed (not counting those timed out: the allocator may be slow)
	stale    int // epochs refused
}

// Sent is the call's first send: its leases are counted from there.
func (c *Call) Sent() bucket.Instant { return c.sent }

// NewCalls returns the call machine of spender id in epoch (a positive
// number that grows across restarts), with the timing knobs tuning, at now.
func NewCalls(id string, epoch uint64, tuning Tuning, now bucket.Instant) *Calls {
	return &Calls{tuning: tuning, id: id, epoch: epoch, nextTick: now.Add(tuning.MaintenanceInterval),
		rng: rand.New(rand.NewPCG(epoch, uint64(len(id)))), rtt: time.Millisecond}
}

// Caller is the spender's id and epoch, with the sequence of the last call.
func (m *Calls) Caller() Caller { return Caller{ID: m.id, Epoch: m.epoch, Seq: m.seq} }

// Env is what the keys' rules read of the machine now.
func (m *Calls) Env() Env {
	return Env{Tuning: m.tuning, TTL: m.ttl, Lead: m.lead(), Fallback: m.fallback}
}

// lead is how long before a lease runs out a refresh should start.
func (m *Calls) lead() time.Duration {
	return 2*m.rtt + m.tuning.BatchWindow + 5*time.Millisecond
}

// Queue records a key queued at now for the next Acquire.
func (m *Calls) Queue(now bucket.Instant) {
	if m.queued == 0 {
		m.queuedAt = now
	}
	m.queued++
}

// Urge makes the queued keys go without waiting for the batching window
// (a Reserve waits on one of them, or a Flush on all).
func (m *Calls) Urge() { m.urgent = true }

// Ahead records a reservation ahead queued for the next ReserveAhead,
// which goes at once.
func (m *Calls) Ahead() {
	m.aheads++
	m.urgent = true
}

// Next returns the call to send at now, or nil; fresh reports a new call,
// whose body is the first Size queued keys (Acquire) or jobs
// (ReserveAhead), in the order they were queued. A call stays outstanding
// until it is answered or given up: after a failure, Next returns it again
// (same body and sequence, or a new epoch: its Caller says) once its
// backoff has passed.
func (m *Calls) Next(now bucket.Instant) (c *Call, fresh bool) {
	if m.stopped {
		return nil, false
	}
	if c := m.call; c != nil {
		if c.inFlight || now < c.resendAt {
			return nil, false
		}
		c.inFlight, c.attempt, c.Caller = true, now, m.Caller()
		return c, false
	}
	switch {
	case m.queued > 0 && (m.urgent || now >= m.queuedAt.Add(m.tuning.BatchWindow)):
		n := min(m.queued, ration.MaxBatch)
		m.queued -= n
		m.queuedAt = now
		if m.queued == 0 {
			m.urgent = false
		}
		c = &Call{Kind: Acquire, Size: n}
	case m.aheads > 0:
		n := min(m.aheads, ration.MaxBatch)
		m.aheads -= n
		if m.aheads == 0 {
			m.urgent = m.queued > 0 && m.urgent
		}
		c = &Call{Kind: ReserveAhead, Size: n}
	default:
		return nil, false
	}
	c.sent, c.attempt, c.inFlight, c.backoff = now, now, true, 10*time.Millisecond
	m.seq++
	c.Caller = m.Caller()
	m.call = c
	return c, true
}

// AttemptTimeout bounds one attempt of a call: ten smoothed round trips or
// three times the slowest recent answer, whichever is longer, at least
// 25ms, at most the call timeout. It follows the allocator's own tail (a
// commit that lingers), so a slow answer is not taken for a lost one;
// before the first answer it is ten slow-path deadlines.
func (m *Calls) AttemptTimeout() time.Duration {
	t := m.tuning
	if m.rttMax == 0 {
		return min(t.CallTimeout, 10*t.SlowPathDeadline)
	}
	return min(t.CallTimeout, max(25*time.Millisecond, 10*m.rtt, 3*m.rttMax))
}

// Answered records the answer to c's attempt at now, whose lease TTL is
// ttl (0: not an Acquire's, or none said). The allocator serves this
// spender again: it reports whether that ended the fallback.
func (m *Calls) Answered(now bucket.Instant, c *Call, ttl time.Duration) (recovered bool) {
	c.inFlight = false
	m.call, m.answered = nil, true
	d := now.Sub(c.attempt)
	m.rtt = (m.rtt*7 + d) / 8
	m.rttMax = max(d, m.rttMax-m.rttMax/16) // the slowest of roughly the last sixteen answers
	if ttl > 0 {
		m.ttl = ttl
	}
	return m.SetFallback(false)
}

// FailKind is what went wrong with an attempt, as the driver read the
// allocator's error.
type FailKind uint8

const (
	// FailTransport: the network or the allocator failed the attempt,
	// or the driver stopped waiting (Cut), or the allocator refused the
	// spender's credential (Refused).
	FailTransport FailKind = iota + 1
	// FailKey: the allocator refused entry Index of the call as invalid
	// for that key alone.
	FailKey
	// FailEpochRange: the allocator refuses the spender's epoch as too far
	// ahead of its clock: every call would be refused.
	FailEpochRange
	// FailMalformed: the allocator rejected the call as invalid.
	FailMalformed
	// FailStale: the allocator refused the epoch or sequence as stale; it
	// has the spender at epoch Latest (math.MaxUint64: unknown), and
	// StaleEpoch says whether the epoch (not the sequence) was refused.
	FailStale
)

// Failure is a failed attempt.
type Failure struct {
	Kind       FailKind
	Cut        bool   // FailTransport: the driver stopped waiting (the allocator may be slow)
	Refused    bool   // FailTransport: the allocator refused the credential
	Index      int    // FailKey
	Latest     uint64 // FailStale
	StaleEpoch bool   // FailStale
	// Wall is the wall-clock time at the failure, in nanoseconds since
	// the Unix epoch: a new epoch starts at least there.
	Wall uint64
}

// Verdict is what a failed attempt asks of the driver.
type Verdict uint8

const (
	// Retry: the call is sent again after its backoff (Next says when).
	// With Unreachable, the allocator now counts as unreachable: the
	// call's waiters are let go to the fallback policy.
	Retry Verdict = iota + 1
	// Drop: the call is given up for good (retrying cannot help): the
	// allocator is not serving this spender, and the waiters are let go.
	Drop
	// Stop: no more calls (the epoch is out of range, or Duplicate:
	// another live process has this spender's id, at epoch Latest): the
	// spender serves its leases, then its fallback policy.
	Stop
	// TakeOut: entry Index leaves the call, which the allocator refused
	// for that key alone; the rest is sent again at once, as a new call
	// (Emptied: nothing was left, and there is no call).
	TakeOut
	// NewEpoch: the call is sent again at once in a new epoch.
	NewEpoch
)

// Outcome is Failed's answer.
type Outcome struct {
	Verdict     Verdict
	Unreachable bool // Retry: the allocator counts as unreachable from now
	Duplicate   bool // Stop: another live process uses this spender's id
	Emptied     bool // TakeOut: the call had no other entry
}

// Failed records the failure f of c's attempt at now. A call failing for
// three attempts, or for longer than the slow-path deadline, makes the
// allocator count as unreachable. Attempts that were merely cut count
// only once c has gone unanswered for the slow-path deadline plus the
// call timeout: a stalled commit is not an outage. A refused credential
// is at once: retrying soon will not change the allocator's mind (the
// call is still retried with backoff: a credential the allocator accepts
// again ends it).
func (m *Calls) Failed(now bucket.Instant, c *Call, f Failure) Outcome {
	c.inFlight = false
	switch f.Kind {
	case FailKey:
		c.Size--
		if c.Size == 0 {
			m.call = nil
			return Outcome{Verdict: TakeOut, Emptied: true}
		}
		m.seq++ // another body: another sequence
		c.resendAt = now
		return Outcome{Verdict: TakeOut}
	case FailEpochRange:
		m.stop()
		return Outcome{Verdict: Stop}
	case FailMalformed:
		m.call = nil
		return Outcome{Verdict: Drop}
	case FailStale:
		if f.StaleEpoch && m.answered {
			m.stop()
			return Outcome{Verdict: Stop, Duplicate: true}
		}
		// Our epoch or sequence is stale, and none of our calls was
		// answered in this epoch (a dead predecessor with our id and a
		// later clock), or the allocator lost our session's tail: start a
		// new epoch above the allocator's and resend the same body.
		// Holdings of the old one simply expire.
		if c.stale++; c.stale > 3 || f.Latest == math.MaxUint64 {
			m.call = nil
			return Outcome{Verdict: Drop}
		}
		m.epoch = max(m.epoch+1, f.Latest+1, f.Wall)
		m.seq, m.answered = 1, false
		c.resendAt = now
		return Outcome{Verdict: NewEpoch}
	}
	t := m.tuning
	if !f.Cut {
		c.fails++
	}
	jitter := time.Duration(m.rng.Int64N(int64(c.backoff)/2 + 1))
	c.resendAt = now.Add(c.backoff/2 + jitter)
	c.backoff = min(2*c.backoff, max(time.Second, m.ttl/4))
	age := now.Sub(c.sent)
	unreachable := f.Refused || age >= t.SlowPathDeadline+t.CallTimeout ||
		!f.Cut && (c.fails >= 3 || age >= t.SlowPathDeadline)
	return Outcome{Verdict: Retry, Unreachable: unreachable}
}

// stop ends the machine's calls for good.
func (m *Calls) stop() { m.stopped, m.call = true, nil }

// Stopped reports whether the machine makes no more calls.
func (m *Calls) Stopped() bool { return m.stopped }

// Failing reports whether the call under way has failed an attempt: the
// allocator is then not merely slow.
func (m *Calls) Failing() bool { return m.call != nil && m.call.fails > 0 }

// Idle reports whether nothing is queued or in a call.
func (m *Calls) Idle() bool { return m.call == nil && m.queued == 0 && m.aheads == 0 }

// SetFallback records whether the allocator counts as unreachable, and
// reports whether that changed.
func (m *Calls) SetFallback(on bool) (changed bool) {
	changed = m.fallback != on
	m.fallback = on
	return changed
}

// Tick reports whether maintenance is due at now, and if so schedules the
// next.
func (m *Calls) Tick(now bucket.Instant) bool {
	if now < m.nextTick {
		return false
	}
	m.nextTick = now.Add(m.tuning.MaintenanceInterval)
	return true
}

// NextWake is when the machine next needs to run: maintenance, the end of
// the batching window, or a call's resend. A driver that has nothing to
// send sleeps until then (or until something is queued).
func (m *Calls) NextWake(now bucket.Instant) bucket.Instant {
	at := m.nextTick
	if m.stopped {
		// No call is ever sent again: queued keys (a share's renewal, a
		// refresh) must not wake the driver now, over and over.
		return at
	}
	switch c := m.call; {
	case c != nil && !c.inFlight:
		at = min(at, c.resendAt)
	case c != nil:
	case m.queued > 0 && m.urgent, m.aheads > 0:
		at = now
	case m.queued > 0:
		at = min(at, m.queuedAt.Add(m.tuning.BatchWindow))
	}
	return at
}

// Release returns the Caller of the Release call that ends the machine.
func (m *Calls) Release() Caller {
	m.seq++
	return m.Caller()
}
