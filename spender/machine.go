package spender

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect/v2"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
	"github.com/rationhq/ration/internal/leasewire"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender/internal/lease"
)

// leaser is a leased Limiter's lease state machine: it decides which call
// to send to the allocator and when, applies answers and failures, and
// keeps every key's lease (in the keys' leaseStates, under their shard
// locks). It reads no clock, starts no goroutine and does no I/O: every
// input carries the time, and its outputs are the call to send (nextCall),
// the time it next needs to run (nextWake), and the admissions it makes
// through reserveLeased. A driver moves it: the Limiter's own goroutine
// (driver.go) on the Limiter's Clock, or the simulator on virtual time.
//
// Calls are made one at a time, each with (spender id, epoch, sequence);
// a failed call is sent again with the same sequence and body until it is
// answered, so the allocator applies it exactly once.
//
// Reserve paths may run concurrently with each other and with the driver;
// nextCall, deliver and tick are called by one driver at a time.
type leaser struct {
	l   *Limiter
	cfg leaseConfig
	log *slog.Logger
	id  string

	mu       sync.Mutex // guards the fields below; taken after a shard lock, never before
	epoch    uint64
	seq      uint64
	queue    []*keyState // keys for the next Acquire
	queuedAt bucket.Instant
	urgent   bool // a Reserve waits on a queued key: skip the batching window
	aheads   []*aheadJob
	call     *LeaseCall     // the call being sent; nil when none
	nextTick bucket.Instant // when maintenance runs next
	flushes  []chan struct{}
	closing  bool
	rng      *rand.Rand
	notify   func() // the driver's wake-up, called when something is queued; nil for none
	answered bool   // a call was answered in the current epoch
	dup      error  // the allocator will not take our calls (ErrDuplicateSpender, ErrSpenderRefused): no more calls
	down     error  // while fallback is on: the failure that turned it on

	fallback  atomic.Bool    // the allocator counts as unreachable
	rtt       atomic.Int64   // smoothed call latency, nanoseconds
	rttMax    atomic.Int64   // the slowest recent answer, decaying; 0 until the first answer
	fbLogAt   bucket.Instant // guarded by mu: when the next fallback admission may be logged
	fbLogged  int            // guarded by mu: fallback admissions since the last log line
	maxActive atomic.Uint32
	ttl       atomic.Int64 // the lease TTL the allocator last answered with (a Duration); 0 before

	// What the machine has done (Machine.Counts), as its Metrics count it.
	keysHeld               atomic.Int64
	fallbackAdmits         atomic.Int64
	accruedReq, accruedTok atomic.Int64
}

// aheadJob is a ReserveAt waiting for the allocator's reserve-ahead.
type aheadJob struct {
	st        *keyState
	lim       ration.Limits
	cost      ration.Amount
	maxWait   time.Duration
	done      chan struct{} // closed when the result is set
	res       *lease.Reserved
	recv      bucket.Instant
	err       error // the call failed: the waiter follows the fallback policy
	abandoned bool  // the waiter gave up; a late reservation is given back
}

// LeaseCall is one allocator call: an Acquire for keys, or a ReserveAhead
// for jobs.
type LeaseCall struct {
	acquire *leasev1.AcquireRequest
	keys    []*keyState
	waits   []chan struct{} // per key: closed when the call ends

	ahead *leasev1.ReserveAheadRequest
	jobs  []*aheadJob

	sent     bucket.Instant // first send: leases are counted from here
	attempt  bucket.Instant // this attempt's send
	inFlight bool           // handed to the driver, not yet delivered
	resendAt bucket.Instant
	backoff  time.Duration
	fails    int  // attempts that failed (not counting those timed out: the allocator may be slow)
	stale    int  // epochs refused
	given    bool // the waiters were let go (fallback) at a failure
}

// size is the number of keys in c.
func (c *LeaseCall) size() int { return len(c.keys) + len(c.jobs) }

// Method names the call's RPC.
func (c *LeaseCall) method() string {
	if c.ahead != nil {
		return "ReserveAhead"
	}
	return "Acquire"
}

func newLeaser(l *Limiter, cfg leaseConfig, now bucket.Instant) *leaser {
	lz := &leaser{l: l, cfg: cfg, log: cfg.logger, id: cfg.spenderID, epoch: cfg.epoch, nextTick: now.Add(cfg.tuning.MaintenanceInterval)}
	if lz.log == nil {
		lz.log = slog.Default()
	}
	if lz.id == "" {
		host, _ := os.Hostname()
		lz.id = fmt.Sprintf("%s/%d/%08x", host, os.Getpid(), rand.Uint32())
		if len(lz.id) > ration.MaxSpenderIDLen {
			lz.id = lz.id[len(lz.id)-ration.MaxSpenderIDLen:]
		}
	}
	if lz.epoch == 0 {
		lz.epoch = uint64(l.timeOf(now).UnixNano())
	}
	lz.rng = rand.New(rand.NewPCG(lz.epoch, uint64(len(lz.id))))
	lz.rtt.Store(int64(time.Millisecond))
	return lz
}

// enqueueLocked puts st in the next Acquire (the caller holds st's shard
// lock). An urgent key skips the batching window.
func (lz *leaser) enqueueLocked(st *keyState, urgent bool, now bucket.Instant) {
	lz.mu.Lock()
	if !st.lk.Queued() {
		st.lk.SetQueued(true)
		if len(lz.queue) == 0 {
			lz.queuedAt = now
		}
		lz.queue = append(lz.queue, st)
	}
	lz.urgent = lz.urgent || urgent
	lz.mu.Unlock()
	lz.wake()
}

func (lz *leaser) wake() {
	if lz.notify != nil {
		lz.notify()
	}
}

// attemptTimeout bounds one attempt of a call: ten smoothed round trips or
// three times the slowest recent answer, whichever is longer, at least
// 25ms, at most the configured call timeout. It follows the allocator's
// own tail (a commit that lingers), so a slow answer is not taken for a
// lost one; before the first answer it is ten slow-path deadlines.
func (lz *leaser) attemptTimeout() time.Duration {
	tune := lz.cfg.tuning
	slowest := time.Duration(lz.rttMax.Load())
	if slowest == 0 {
		return min(tune.CallTimeout, 10*tune.SlowPathDeadline)
	}
	return min(tune.CallTimeout, max(25*time.Millisecond, 10*time.Duration(lz.rtt.Load()), 3*slowest))
}

// observe records an answer's latency d.
func (lz *leaser) observe(d time.Duration) {
	lz.rtt.Store((lz.rtt.Load()*7 + int64(d)) / 8)
	m := lz.rttMax.Load()
	lz.rttMax.Store(max(int64(d), m-m/16)) // the slowest of roughly the last sixteen answers
}

// lead is how long before a lease runs out a refresh should start.
func (lz *leaser) lead() time.Duration {
	return 2*time.Duration(lz.rtt.Load()) + lz.cfg.tuning.BatchWindow + 5*time.Millisecond
}

// env is what the keys' rules read of the machine at this moment.
func (lz *leaser) env() lease.Env {
	return lease.Env{Tuning: lease.Tuning(lz.cfg.tuning), TTL: lz.leaseTTL(), Lead: lz.lead(), Fallback: lz.fallback.Load()}
}

// leaseTTL is the lease TTL the allocator last answered with (0 before
// any answer).
func (lz *leaser) leaseTTL() time.Duration { return time.Duration(lz.ttl.Load()) }

// accrued counts a share's accrual credited to a lease.
func (lz *leaser) accrued(a ration.Amount) {
	if a != (ration.Amount{}) {
		lz.accruedReq.Add(a.Requests)
		lz.accruedTok.Add(a.Tokens)
		lz.cfg.metrics.shareAccrued(a)
	}
}

// nextCall returns the call to send at now, or nil. A call stays
// outstanding until deliver ends it: after a failure, nextCall returns it
// again (same body and sequence, or a new epoch) once its backoff has
// passed.
func (lz *leaser) nextCall(now bucket.Instant) *LeaseCall {
	lz.mu.Lock()
	if lz.dup != nil {
		lz.mu.Unlock()
		return nil
	}
	if c := lz.call; c != nil {
		if c.inFlight || now < c.resendAt {
			lz.mu.Unlock()
			return nil
		}
		c.inFlight, c.attempt = true, now
		lz.setCallerLocked(c)
		lz.mu.Unlock()
		return c
	}
	var keys []*keyState
	var jobs []*aheadJob
	switch {
	case len(lz.queue) > 0 && (lz.urgent || now >= lz.queuedAt.Add(lz.cfg.tuning.BatchWindow)):
		n := min(len(lz.queue), ration.MaxBatch)
		keys = lz.queue[:n:n]
		lz.queue = lz.queue[n:]
		lz.queuedAt = now
		if len(lz.queue) == 0 {
			lz.queue, lz.urgent = nil, false
		}
	case len(lz.aheads) > 0:
		n := min(len(lz.aheads), ration.MaxBatch)
		jobs = lz.aheads[:n:n]
		lz.aheads = lz.aheads[n:]
		if len(lz.aheads) == 0 {
			lz.aheads = nil
			lz.urgent = len(lz.queue) > 0 && lz.urgent
		}
	default:
		lz.mu.Unlock()
		return nil
	}
	lz.mu.Unlock()

	var c *LeaseCall
	if keys != nil {
		c = lz.buildAcquire(keys, now) // takes shard locks: not under lz.mu
	} else {
		c = buildAhead(jobs)
	}
	c.sent, c.attempt, c.inFlight, c.backoff = now, now, true, 10*time.Millisecond
	lz.mu.Lock()
	lz.seq++
	lz.call = c
	lz.setCallerLocked(c)
	lz.mu.Unlock()
	return c
}

// setCallerLocked stamps c with the current (id, epoch, sequence).
func (lz *leaser) setCallerLocked(c *LeaseCall) {
	caller := &leasev1.Caller{SpenderId: lz.id, Epoch: lz.epoch, Sequence: lz.seq}
	if c.ahead != nil {
		c.ahead.Caller = caller
	} else {
		c.acquire.Caller = caller
	}
}

// buildAcquire takes keys' reports and needs into one call body. What goes
// into the body (returns, debts) leaves the keys: it is delivered exactly
// once, with the answer.
func (lz *leaser) buildAcquire(keys []*keyState, now bucket.Instant) *LeaseCall {
	c := &LeaseCall{acquire: &leasev1.AcquireRequest{Keys: make([]*leasev1.KeyAcquire, 0, len(keys))},
		keys: keys, waits: make([]chan struct{}, len(keys))}
	env := lz.env()
	for i, st := range keys {
		sh := st.sh
		sh.mu.Lock()
		en, accrued := env.Entry(st.lk, now)
		c.acquire.Keys = append(c.acquire.Keys, toKeyAcquire(&en))
		c.waits[i] = st.wait
		st.wait = nil
		sh.mu.Unlock()
		lz.accrued(accrued)
	}
	return c
}

func buildAhead(jobs []*aheadJob) *LeaseCall {
	req := &leasev1.ReserveAheadRequest{Keys: make([]*leasev1.KeyReserve, len(jobs))}
	for i, j := range jobs {
		req.Keys[i] = &leasev1.KeyReserve{Key: j.st.key, Limits: leasewire.NewLimits(j.lim), Cost: leasewire.NewAmount(j.lim.Limited(j.cost)),
			MaxWaitUs: int64(j.maxWait / time.Microsecond)}
	}
	return &LeaseCall{ahead: req, jobs: jobs}
}

// deliverAcquire applies the allocator's answer to the Acquire c at now,
// or with a non-nil err, the failure of its attempt (see deliver).
func (lz *leaser) deliverAcquire(now bucket.Instant, c *LeaseCall, resp *leasev1.AcquireResponse, err error) {
	if err == nil && (c.acquire == nil || len(resp.GetKeys()) != len(c.acquire.GetKeys())) {
		err = fmt.Errorf("spender: the allocator answered %d keys for %d", len(resp.GetKeys()), c.size())
	}
	if lz.deliver(now, c, err) {
		lz.finishAcquire(c, resp, now)
		lz.checkFlushes()
	}
}

// deliverAhead applies the allocator's answer to the ReserveAhead c at
// now, or with a non-nil err, the failure of its attempt (see deliver).
func (lz *leaser) deliverAhead(now bucket.Instant, c *LeaseCall, resp *leasev1.ReserveAheadResponse, err error) {
	if err == nil && (c.ahead == nil || len(resp.GetKeys()) != len(c.ahead.GetKeys())) {
		err = fmt.Errorf("spender: the allocator answered %d keys for %d", len(resp.GetKeys()), c.size())
	}
	if lz.deliver(now, c, err) {
		lz.finishAhead(c, resp, now)
		lz.checkFlushes()
	}
}

// deliver ends c's attempt at now: with a nil err it was answered, and
// deliver reports true for the caller to apply the answer. With a non-nil
// err, the failure of the attempt: c is then sent again after a backoff
// (with a new epoch if the allocator refused ours), or dropped if the
// allocator rejected it as malformed. After three failed attempts, or once
// c has been failing for longer than the slow-path deadline, the allocator
// counts as unreachable: the keys' waiters are let go to the fallback
// policy until a call is answered. Attempts that merely timed out
// (ErrAttemptTimedOut) count only once c has gone unanswered for the
// slow-path deadline plus the call timeout: a stalled commit is not an
// outage.
func (lz *leaser) deliver(now bucket.Instant, c *LeaseCall, err error) bool {
	lz.mu.Lock()
	c.inFlight = false
	if err == nil {
		lz.call, lz.answered = nil, true
		lz.mu.Unlock()
		lz.observe(now.Sub(c.attempt))
		lz.setFallback(false, nil)
		return true
	}
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument:
		if i, reason, ok := refusedKey(err, c.size()); ok {
			lz.rejectKeyLocked(c, i, reason, now)
			return false
		}
		if refusedField(err) == "caller.epoch" {
			// Our epoch is too far past the allocator's clock (ours runs
			// ahead, or WithEpoch chose it): every call would be refused.
			lz.stopLocked(c, now, fmt.Errorf("%w: epoch %d: %w", ErrSpenderRefused, lz.epoch, err),
				"spender: the allocator refuses our epoch (is this clock a day ahead of the allocator's?); no more allocator calls from this one (leases, then the fallback policy)")
			return false
		}
		lz.dropLocked(c, now, "spender: allocator rejected a call; not retrying", err)
		return false
	case connect.CodeFailedPrecondition:
		latest, staleEpoch := refusedEpoch(err)
		if staleEpoch && lz.answered {
			lz.duplicateLocked(c, now, latest, err)
			return false
		}
		// Our epoch or sequence is stale, and none of our calls was
		// answered in this epoch (a dead predecessor with our id and a
		// later clock), or the allocator lost our session's tail: start a
		// new epoch above the allocator's and resend the same body.
		// Holdings of the old one simply expire.
		if c.stale++; c.stale > 3 || latest == math.MaxUint64 {
			lz.dropLocked(c, now, "spender: allocator keeps refusing our epoch; giving up the call", err)
			return false
		}
		lz.epoch = max(lz.epoch+1, latest+1, uint64(lz.l.timeOf(now).UnixNano()))
		lz.seq, lz.answered = 1, false
		c.resendAt = now
		lz.mu.Unlock()
		lz.log.Warn("spender: allocator refused our epoch or sequence; starting a new epoch", "method", c.method(), "epoch", lz.epoch, "err", err)
		return false
	}
	// An attempt we stopped waiting for is a slow allocator (or a lost
	// message) until the call has gone unanswered as long as a waiter may
	// wait: the slow-path deadline plus the call timeout. A failure the
	// network or the allocator reported is an outage sooner. A refused
	// credential is at once: retrying soon will not change the allocator's
	// mind, and admitting by the fallback policy would hide the
	// misconfiguration, so Reserves that need the allocator fail naming it
	// (the call is still retried with backoff: a credential the allocator
	// accepts again ends it).
	tune := lz.cfg.tuning
	cut := errors.Is(err, ErrAttemptTimedOut)
	code := connect.CodeOf(err)
	refused := code == connect.CodeUnauthenticated || code == connect.CodePermissionDenied
	if !cut {
		c.fails++
	}
	jitter := time.Duration(lz.rng.Int64N(int64(c.backoff)/2 + 1))
	c.resendAt = now.Add(c.backoff/2 + jitter)
	c.backoff = min(2*c.backoff, max(time.Second, lz.leaseTTL()/4))
	age := now.Sub(c.sent)
	unreachable := refused || age >= tune.SlowPathDeadline+tune.CallTimeout ||
		!cut && (c.fails >= 3 || age >= tune.SlowPathDeadline)
	lz.mu.Unlock()
	if unreachable {
		down := fmt.Errorf("%w: %w", ErrAllocatorUnreachable, err)
		if refused {
			down = fmt.Errorf("%w: %w", ErrCredentialRefused, err)
		}
		lz.setFallback(true, down) // before the waiters look again
		lz.giveUp(c, now)
	}
	return false
}

// dropLocked gives c up for good (with lz.mu held, which it releases):
// retrying cannot help. The allocator is not serving this spender: its
// waiters are let go to the fallback policy (asking again would only be
// refused again, a call per look), and Ready says so until a call is
// answered.
func (lz *leaser) dropLocked(c *LeaseCall, now bucket.Instant, msg string, err error) {
	lz.call = nil
	lz.mu.Unlock()
	lz.log.Error(msg, "method", c.method(), "err", err)
	lz.setFallback(true, fmt.Errorf("%w: it refused a call: %w", ErrAllocatorUnreachable, err))
	lz.giveUp(c, now)
	lz.checkFlushes()
}

// rejectKeyLocked takes entry i out of c, which the allocator refused as
// invalid for that key alone (with lz.mu held, which it releases). Nothing
// in c was applied: the key fails with the allocator's reason and is not
// asked for again until its limits change; the rest of c is sent again at
// once, as a new call.
func (lz *leaser) rejectKeyLocked(c *LeaseCall, i int, reason string, now bucket.Instant) {
	var st *keyState
	var wait chan struct{}
	var job *aheadJob
	if c.ahead != nil {
		job, st = c.jobs[i], c.jobs[i].st
		c.jobs = slices.Delete(c.jobs, i, i+1)
		c.ahead.Keys = slices.Delete(c.ahead.Keys, i, i+1)
	} else {
		st, wait = c.keys[i], c.waits[i]
		c.keys = slices.Delete(c.keys, i, i+1)
		c.waits = slices.Delete(c.waits, i, i+1)
		c.acquire.Keys = slices.Delete(c.acquire.Keys, i, i+1)
	}
	empty := c.size() == 0
	if empty {
		lz.call = nil
	} else {
		lz.seq++ // another body: another sequence
		c.resendAt = now
	}
	lz.mu.Unlock()
	rej := fmt.Errorf("%w %q: %s", ErrKeyRejected, st.key, reason)
	lz.log.Error("spender: the allocator rejected a key; it fails alone and is not asked for again until its limits change",
		"key", st.key, "reason", reason)
	st.sh.mu.Lock()
	st.lk.Reject(rej)
	if job == nil {
		st.lk.SetInCall(false)
	}
	st.sh.mu.Unlock()
	if job != nil {
		job.finish(nil, now, rej)
	}
	if wait != nil {
		close(wait)
	}
	if empty {
		lz.checkFlushes()
	}
	lz.wake()
}

// duplicateLocked stops the machine's calls for good (with lz.mu held,
// which it releases): the allocator moved our id to epoch latest while our
// calls in this epoch were being answered, so another live process has
// our id. Taking it back would only make the two refuse each other in
// turn; this one serves its leases, then its fallback policy, and reports
// the duplicate in Ready and Close.
func (lz *leaser) duplicateLocked(c *LeaseCall, now bucket.Instant, latest uint64, err error) {
	lz.stopLocked(c, now, fmt.Errorf("%w: id %q is in epoch %d at the allocator, ours is %d; give every process its own id: %w",
		ErrDuplicateSpender, lz.id, latest, lz.epoch, err),
		"spender: another live process uses our spender id; no more allocator calls from this one (leases, then the fallback policy)")
}

// stopLocked stops the machine's calls for good (with lz.mu held, which it
// releases), for the reason stop, which Ready and Close report: retrying
// cannot help. It logs msg, serves the leases, then the fallback policy.
func (lz *leaser) stopLocked(c *LeaseCall, now bucket.Instant, stop error, msg string) {
	lz.dup = stop
	lz.call = nil
	lz.mu.Unlock()
	lz.log.Error(msg, "spender_id", lz.id, "epoch", lz.epoch, "err", stop)
	lz.giveUp(c, now)
	lz.setFallback(true, lz.dup)
	lz.checkFlushes()
}

// ready is the Limiter's Ready.
func (lz *leaser) ready() error {
	lz.mu.Lock()
	defer lz.mu.Unlock()
	switch {
	case lz.dup != nil:
		return lz.dup
	case lz.fallback.Load():
		return lz.down
	}
	return nil
}

// refusedCredential is the allocator's refusal of this spender's
// credential while it lasts (ErrCredentialRefused), nil otherwise.
func (lz *leaser) refusedCredential() error {
	if !lz.fallback.Load() {
		return nil
	}
	lz.mu.Lock()
	defer lz.mu.Unlock()
	if errors.Is(lz.down, ErrCredentialRefused) {
		return lz.down
	}
	return nil
}

// awaitingAnswer reports whether st's key is queued for, or carried by, a
// call that has not failed (the caller holds st's shard lock): the
// allocator is slow, not known to be unreachable.
func (lz *leaser) awaitingAnswer(k *lease.Key) bool {
	if !k.Queued() && !k.InCall() {
		return false
	}
	lz.mu.Lock()
	defer lz.mu.Unlock()
	return lz.call == nil || lz.call.fails == 0
}

// logFallback logs fallback admissions at most once a second, with their
// count (every one is also counted in the metrics).
func (lz *leaser) logFallback(key string, now bucket.Instant) {
	lz.mu.Lock()
	lz.fbLogged++
	if now < lz.fbLogAt {
		lz.mu.Unlock()
		return
	}
	n := lz.fbLogged
	lz.fbLogged, lz.fbLogAt = 0, now.Add(time.Second)
	lz.mu.Unlock()
	lz.log.Warn("spender: admitted under the fallback policy", "key", key, "admissions", n, "policy", lz.cfg.policy.String())
}

// giveUp lets c's waiters go (once): Reserves waiting on its keys look
// again and follow the fallback policy; ReserveAt callers are told the
// allocator is unreachable. A later answer to an Acquire is still applied;
// a later reservation ahead is given back.
func (lz *leaser) giveUp(c *LeaseCall, now bucket.Instant) {
	if c.given {
		return
	}
	c.given = true
	for _, j := range c.jobs {
		j.finish(nil, now, ErrAllocatorUnreachable)
	}
	for i, st := range c.keys {
		sh := st.sh
		sh.mu.Lock()
		if lz.call != c { // dropped: the keys are no longer in a call
			st.lk.SetInCall(false)
		}
		sh.mu.Unlock()
		if w := c.waits[i]; w != nil {
			close(w)
			c.waits[i] = nil
		}
	}
}

// finishAcquire applies the answer to c and wakes its waiters.
func (lz *leaser) finishAcquire(c *LeaseCall, resp *leasev1.AcquireResponse, recv bucket.Instant) {
	ttl := time.Duration(resp.GetLeaseTtlUs()) * time.Microsecond
	expiry := c.sent.Add(ttl)
	if ttl > 0 {
		lz.ttl.Store(int64(ttl))
	}
	env := lz.env()
	for i, st := range c.keys {
		req, g := c.acquire.GetKeys()[i], fromKeyGrant(resp.GetKeys()[i])
		en := lease.Entry{Limits: leasewire.LimitsOf(req.GetLimits()), Need: leasewire.AmountOf(req.GetNeed()), Demand: leasewire.AmountOf(req.GetDemand())}
		sh := st.sh
		sh.mu.Lock()
		st.lk.SetInCall(false)
		env.Apply(st.lk, &en, &g, c.sent, expiry, recv)
		sh.mu.Unlock()
		if g.Active > lz.maxActive.Load() {
			lz.maxActive.Store(g.Active)
		}
		lz.cfg.metrics.returned(g.Returned)
		if w := c.waits[i]; w != nil {
			close(w)
			c.waits[i] = nil
		}
	}
}

// finishAhead hands each job its reservation; one whose waiter gave up is
// given back on the key's next Acquire.
func (lz *leaser) finishAhead(c *LeaseCall, resp *leasev1.ReserveAheadResponse, recv bucket.Instant) {
	for i, j := range c.jobs {
		kr := fromKeyReservation(resp.GetKeys()[i])
		sh := j.st.sh
		sh.mu.Lock()
		orphan := j.abandoned || c.given
		if orphan && kr.Status == lease.GrantOK {
			j.st.lk.GiveBack(j.lim.Limited(j.cost))
			lz.enqueueLocked(j.st, false, recv)
		}
		sh.mu.Unlock()
		if !orphan {
			j.finish(&kr, recv, nil)
		}
	}
}

// finish records the job's result and wakes its waiter.
func (j *aheadJob) finish(r *lease.Reserved, recv bucket.Instant, err error) {
	sh := j.st.sh
	sh.mu.Lock()
	select {
	case <-j.done:
	default:
		j.res, j.recv, j.err = r, recv, err
		close(j.done)
	}
	sh.mu.Unlock()
}

// setFallback records whether the allocator serves this spender (off) or
// not (on, with the reason Ready reports: an error wrapping
// ErrAllocatorUnreachable, ErrCredentialRefused or ErrDuplicateSpender),
// logging and counting each switch once.
func (lz *leaser) setFallback(on bool, err error) {
	if on {
		lz.mu.Lock()
		lz.down = err
		lz.mu.Unlock()
	}
	if lz.fallback.Swap(on) == on {
		return
	}
	lz.cfg.metrics.setFallback(on)
	switch {
	case on && errors.Is(err, ErrCredentialRefused):
		lz.log.Error("spender: the allocator refused this spender's credential; requests without a valid lease fail until it accepts it",
			"err", err)
	case on:
		lz.log.Warn("spender: allocator unreachable; spending valid leases, then falling back", "policy", lz.cfg.policy.String(), "err", err)
	default:
		lz.log.Info("spender: allocator reachable again; fallback admissions are reported as debt")
	}
}

// tick runs maintenance at now if it is due: a lease about to expire is
// renewed for a key in use and given back for an idle one; debts and
// returns waiting on an idle key are queued.
func (lz *leaser) tick(now bucket.Instant) {
	lz.mu.Lock()
	due := now >= lz.nextTick
	if due {
		lz.nextTick = now.Add(lz.cfg.tuning.MaintenanceInterval)
	}
	lz.mu.Unlock()
	if due {
		lz.maintain(now, false)
	}
}

// nextWake is when the machine next needs to run: maintenance, the end of
// the batching window, or a call's resend. A driver that has nothing to
// send sleeps until then (or until something is queued).
func (lz *leaser) nextWake(now bucket.Instant) bucket.Instant {
	lz.mu.Lock()
	defer lz.mu.Unlock()
	at := lz.nextTick
	if lz.dup != nil {
		// No call is ever sent again: queued keys (a share's renewal, a
		// refresh) must not wake the driver now, over and over.
		return at
	}
	switch c := lz.call; {
	case c != nil && !c.inFlight:
		at = min(at, c.resendAt)
	case c != nil:
	case len(lz.queue) > 0 && lz.urgent, len(lz.aheads) > 0:
		at = now
	case len(lz.queue) > 0:
		at = min(at, lz.queuedAt.Add(lz.cfg.tuning.BatchWindow))
	}
	return at
}

// maintain scans every key. With force, every key with anything to report
// is queued.
func (lz *leaser) maintain(now bucket.Instant, force bool) {
	env := lz.env()
	soon := now.Add(2*lz.cfg.tuning.MaintenanceInterval + env.Lead)
	var held int
	var shareRate [2]float64 // requests, tokens per minute held in shares
	for i := range lz.l.shards {
		sh := &lz.l.shards[i]
		sh.mu.Lock()
		if now >= sh.sweepAt {
			sh.sweepLocked(now) // idle keys go even when no traffic touches their shard
		}
		for st := range sh.keys.all() {
			h, rate, accrued, send := env.Scan(st.lk, now, soon, force)
			lz.accrued(accrued)
			shareRate[0] += rate[0]
			shareRate[1] += rate[1]
			if h {
				held++
			}
			if send {
				lz.enqueueLocked(st, force, now)
			}
		}
		sh.mu.Unlock()
	}
	lz.keysHeld.Store(int64(held))
	lz.cfg.metrics.setKeysHeld(held)
	lz.cfg.metrics.setShareRate(shareRate)
}

// flush queues everything waiting to be reported and returns a channel
// closed once it has all been sent and answered (or given up).
func (lz *leaser) flush(now bucket.Instant) (<-chan struct{}, error) {
	lz.maintain(now, true)
	ch := make(chan struct{})
	lz.mu.Lock()
	if lz.closing {
		lz.mu.Unlock()
		return nil, ErrClosed
	}
	if lz.dup != nil {
		lz.mu.Unlock()
		return nil, lz.dup
	}
	lz.flushes = append(lz.flushes, ch)
	lz.urgent = true
	lz.mu.Unlock()
	lz.checkFlushes()
	lz.wake()
	return ch, nil
}

// checkFlushes releases Flush callers once nothing is queued or in a call.
func (lz *leaser) checkFlushes() {
	lz.mu.Lock()
	defer lz.mu.Unlock()
	if lz.call != nil || len(lz.queue) > 0 || len(lz.aheads) > 0 {
		return
	}
	for _, f := range lz.flushes {
		close(f)
	}
	lz.flushes = nil
}

// release stops the machine and returns the Release call that gives back
// every key's unspent lease and reports its debt (nil if there is nothing
// to give back), with the caller that sends it. It is called once.
func (lz *leaser) release(now bucket.Instant) *leasev1.ReleaseRequest {
	lz.mu.Lock()
	lz.closing = true
	flushes := lz.flushes
	lz.flushes = nil
	lz.mu.Unlock()
	for _, f := range flushes {
		close(f)
	}
	req := &leasev1.ReleaseRequest{}
	for i := range lz.l.shards {
		sh := &lz.l.shards[i]
		sh.mu.Lock()
		for st := range sh.keys.all() {
			en, accrued, ok := st.lk.Release(now)
			lz.accrued(accrued)
			if ok {
				req.Keys = append(req.Keys, &leasev1.KeyRelease{Key: en.Key, Limits: leasewire.NewLimits(en.Limits),
					Returned: leasewire.NewAmount(en.Returned), Debt: leasewire.NewAmount(en.Debt)})
			}
		}
		sh.mu.Unlock()
	}
	lz.mu.Lock()
	lz.seq++
	req.Caller = &leasev1.Caller{SpenderId: lz.id, Epoch: lz.epoch, Sequence: lz.seq}
	lz.mu.Unlock()
	return req
}
