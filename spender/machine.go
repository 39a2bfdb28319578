package spender

import (
	"errors"
	"fmt"
	"log/slog"
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

// leaser is a leased Limiter's lease machine, the driver's side of it: it
// holds the lease core's call machine (lease.Calls, which decides which
// call to send and when, what an attempt's failure means, and when the
// allocator counts as unreachable) and the keys' leases (lease.Key, in the
// keys' states under their shard locks), and does what the core cannot:
// builds the calls' bodies from the keys, converts them to and from the
// wire, wakes the Reserves waiting on a call, logs and counts. It reads no
// clock, starts no goroutine and does no I/O: every input carries the
// time. A driver moves it: the Limiter's own goroutine (driver.go) on the
// Limiter's Clock, or a DrivingSource (the simulator) on virtual time.
//
// Reserve paths may run concurrently with each other and with the driver;
// nextCall, deliver and tick are called by one driver at a time.
type leaser struct {
	l   *Limiter
	cfg leaseConfig
	log *slog.Logger

	mu       sync.Mutex // guards core and the fields below; taken after a shard lock, never before
	core     *lease.Calls
	queue    []*keyState // keys for the next Acquire, as the core counts them
	aheads   []*aheadJob // jobs for the next ReserveAhead
	call     *LeaseCall  // the call being sent; nil when none (written by the driver only)
	flushes  []chan struct{}
	closing  bool
	notify   func() // the driver's wake-up, called when something is queued; nil for none
	dup      error  // the allocator will not take our calls (ErrDuplicateSpender, ErrSpenderRefused): no more calls
	down     error  // while fallback is on: the failure that turned it on
	fbLogAt  bucket.Instant
	fbLogged int // fallback admissions since the last log line

	// env is what the keys' rules read of the core (its TTL, lead and
	// fallback), published after each change so that the admit path reads
	// it without mu.
	env       atomic.Pointer[lease.Env]
	maxActive atomic.Uint32

	// The keys held at the last maintenance (Machine.Counts; the shards
	// count the rest).
	keysHeld atomic.Int64
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
// for jobs, with its sending state in the core (lc).
type LeaseCall struct {
	lc      *lease.Call
	acquire *leasev1.AcquireRequest
	keys    []*keyState
	waits   []chan struct{} // per key: closed when the call ends

	ahead *leasev1.ReserveAheadRequest
	jobs  []*aheadJob

	given bool // the waiters were let go (fallback) at a failure
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
	lz := &leaser{l: l, cfg: cfg, log: cfg.logger}
	if lz.log == nil {
		lz.log = slog.Default()
	}
	id, epoch := cfg.spenderID, cfg.epoch
	if id == "" {
		host, _ := os.Hostname()
		id = fmt.Sprintf("%s/%d/%08x", host, os.Getpid(), rand.Uint32())
		if len(id) > ration.MaxSpenderIDLen {
			id = id[len(id)-ration.MaxSpenderIDLen:]
		}
	}
	if epoch == 0 {
		epoch = uint64(l.timeOf(now).UnixNano())
	}
	lz.core = lease.NewCalls(id, epoch, lease.Tuning(cfg.tuning), now)
	lz.publishLocked()
	return lz
}

// publishLocked publishes what the keys' rules read of the core (lz.mu
// held, or lz not yet shared).
func (lz *leaser) publishLocked() {
	env := lz.core.Env()
	lz.env.Store(&env)
}

// fallback reports whether the allocator counts as unreachable.
func (lz *leaser) fallback() bool { return lz.env.Load().Fallback }

// accruedLocked counts a share's accrual credited to a lease of a key in
// sh (sh locked).
func (lz *leaser) accruedLocked(sh *shard, a ration.Amount) {
	if a != (ration.Amount{}) {
		sh.accrued = sh.accrued.Add(a)
		lz.cfg.metrics.shareAccrued(a)
	}
}

// enqueueLocked puts st in the next Acquire (the caller holds st's shard
// lock). An urgent key skips the batching window.
func (lz *leaser) enqueueLocked(st *keyState, urgent bool, now bucket.Instant) {
	lz.mu.Lock()
	if !st.lk.Queued() {
		st.lk.SetQueued(true)
		lz.core.Queue(now)
		lz.queue = append(lz.queue, st)
	}
	if urgent {
		lz.core.Urge()
	}
	lz.mu.Unlock()
	lz.wake()
}

// enqueueAhead puts j in the next ReserveAhead, which goes at once.
func (lz *leaser) enqueueAhead(j *aheadJob) {
	lz.mu.Lock()
	lz.core.Ahead()
	lz.aheads = append(lz.aheads, j)
	lz.mu.Unlock()
	lz.wake()
}

func (lz *leaser) wake() {
	if lz.notify != nil {
		lz.notify()
	}
}

// attemptTimeout bounds one attempt of a call (lease.Calls.AttemptTimeout).
func (lz *leaser) attemptTimeout() time.Duration {
	lz.mu.Lock()
	defer lz.mu.Unlock()
	return lz.core.AttemptTimeout()
}

// nextCall returns the call to send at now, or nil (lease.Calls.Next). A
// new Acquire takes the keys' reports and needs into its body.
func (lz *leaser) nextCall(now bucket.Instant) *LeaseCall {
	lz.mu.Lock()
	lc, fresh := lz.core.Next(now)
	if lc == nil {
		lz.mu.Unlock()
		return nil
	}
	if !fresh {
		c := lz.call
		setCaller(c)
		lz.mu.Unlock()
		return c
	}
	var keys []*keyState
	var jobs []*aheadJob
	if lc.Kind == lease.Acquire {
		keys = lz.queue[:lc.Size:lc.Size]
		lz.queue = lz.queue[lc.Size:]
		if len(lz.queue) == 0 {
			lz.queue = nil
		}
	} else {
		jobs = lz.aheads[:lc.Size:lc.Size]
		lz.aheads = lz.aheads[lc.Size:]
		if len(lz.aheads) == 0 {
			lz.aheads = nil
		}
	}
	env := *lz.env.Load()
	lz.mu.Unlock()

	var c *LeaseCall
	if keys != nil {
		c = lz.buildAcquire(keys, &env, now) // takes shard locks: not under lz.mu
	} else {
		c = buildAhead(jobs)
	}
	c.lc = lc
	setCaller(c)
	lz.mu.Lock()
	lz.call = c
	lz.mu.Unlock()
	return c
}

// setCaller stamps c's body with its caller as of this attempt.
func setCaller(c *LeaseCall) {
	caller := &leasev1.Caller{SpenderId: c.lc.Caller.ID, Epoch: c.lc.Caller.Epoch, Sequence: c.lc.Caller.Seq}
	if c.ahead != nil {
		c.ahead.Caller = caller
	} else {
		c.acquire.Caller = caller
	}
}

// buildAcquire takes keys' reports and needs into one call body. What goes
// into the body (returns, debts) leaves the keys: it is delivered exactly
// once, with the answer.
func (lz *leaser) buildAcquire(keys []*keyState, env *lease.Env, now bucket.Instant) *LeaseCall {
	c := &LeaseCall{acquire: &leasev1.AcquireRequest{Keys: make([]*leasev1.KeyAcquire, 0, len(keys))},
		keys: keys, waits: make([]chan struct{}, len(keys))}
	for i, st := range keys {
		sh := st.sh
		sh.mu.Lock()
		en, accrued := env.Entry(st.lk, now)
		lz.accruedLocked(sh, accrued)
		c.acquire.Keys = append(c.acquire.Keys, toKeyAcquire(&en))
		c.waits[i] = st.wait
		st.wait = nil
		sh.mu.Unlock()
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
	if lz.deliver(now, c, err, leaseTTLOf(resp)) {
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
	if lz.deliver(now, c, err, 0) {
		lz.finishAhead(c, resp, now)
		lz.checkFlushes()
	}
}

// deliver ends c's attempt at now: with a nil err it was answered (with
// the lease TTL ttl, 0 for none), and deliver reports true for the caller
// to apply the answer. With a non-nil
// err, the failure of the attempt, read from the allocator's error for the
// core to judge (lease.Calls.Failed): c is sent again after a backoff (with
// a new epoch if the allocator refused ours), or dropped if the allocator
// rejected it as malformed, or loses the one entry the allocator refused.
// Once the allocator counts as unreachable, the keys' waiters are let go
// to the fallback policy until a call is answered. A refused credential
// counts at once, and admitting by the fallback policy would hide the
// misconfiguration: Reserves that need the allocator fail naming it.
func (lz *leaser) deliver(now bucket.Instant, c *LeaseCall, err error, ttl time.Duration) bool {
	lz.mu.Lock()
	if err == nil {
		recovered := lz.core.Answered(now, c.lc, ttl)
		lz.call = nil
		lz.publishLocked()
		lz.mu.Unlock()
		if recovered {
			lz.fallbackSwitched(false, nil)
		}
		return true
	}
	f := failureOf(err, c.size())
	f.Wall = uint64(lz.l.timeOf(now).UnixNano())
	before := lz.core.Caller()
	out := lz.core.Failed(now, c.lc, f)
	switch out.Verdict {
	case lease.TakeOut:
		i, reason, _ := refusedKey(err, c.size())
		lz.takeOutLocked(c, i, reason, out.Emptied, now)
	case lease.Stop:
		stop := fmt.Errorf("%w: epoch %d: %w", ErrSpenderRefused, before.Epoch, err)
		msg := "spender: the allocator refuses our epoch (is this clock a day ahead of the allocator's?); no more allocator calls from this one (leases, then the fallback policy)"
		if out.Duplicate {
			stop = fmt.Errorf("%w: id %q is in epoch %d at the allocator, ours is %d; give every process its own id: %w",
				ErrDuplicateSpender, before.ID, f.Latest, before.Epoch, err)
			msg = "spender: another live process uses our spender id; no more allocator calls from this one (leases, then the fallback policy)"
		}
		lz.stopLocked(c, now, stop, msg)
	case lease.Drop:
		msg := "spender: allocator rejected a call; not retrying"
		if f.Kind == lease.FailStale {
			msg = "spender: allocator keeps refusing our epoch; giving up the call"
		}
		lz.dropLocked(c, now, msg, err)
	case lease.NewEpoch:
		epoch := lz.core.Caller().Epoch
		lz.mu.Unlock()
		lz.log.Warn("spender: allocator refused our epoch or sequence; starting a new epoch", "method", c.method(), "epoch", epoch, "err", err)
	default:
		lz.mu.Unlock()
		if out.Unreachable {
			down := fmt.Errorf("%w: %w", ErrAllocatorUnreachable, err)
			if f.Refused {
				down = fmt.Errorf("%w: %w", ErrCredentialRefused, err)
			}
			lz.setFallback(true, down) // before the waiters look again
			lz.giveUp(c, now)
		}
	}
	return false
}

// failureOf reads the allocator's error err for a call of n entries.
func failureOf(err error, n int) lease.Failure {
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument:
		if i, _, ok := refusedKey(err, n); ok {
			return lease.Failure{Kind: lease.FailKey, Index: i}
		}
		if refusedField(err) == "caller.epoch" {
			// Our epoch is too far past the allocator's clock (ours runs
			// ahead, or WithEpoch chose it): every call would be refused.
			return lease.Failure{Kind: lease.FailEpochRange}
		}
		return lease.Failure{Kind: lease.FailMalformed}
	case connect.CodeFailedPrecondition:
		latest, staleEpoch := refusedEpoch(err)
		return lease.Failure{Kind: lease.FailStale, Latest: latest, StaleEpoch: staleEpoch}
	}
	// An attempt we stopped waiting for is a slow allocator (or a lost
	// message) until the call has gone unanswered as long as a waiter may
	// wait; a failure the network or the allocator reported is an outage
	// sooner.
	code := connect.CodeOf(err)
	return lease.Failure{Kind: lease.FailTransport, Cut: errors.Is(err, ErrAttemptTimedOut),
		Refused: code == connect.CodeUnauthenticated || code == connect.CodePermissionDenied}
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

// takeOutLocked takes entry i out of c, which the allocator refused as
// invalid for that key alone (with lz.mu held, which it releases). Nothing
// in c was applied: the key fails with the allocator's reason and is not
// asked for again until its limits change; the rest of c (unless emptied)
// is sent again at once, as a new call.
func (lz *leaser) takeOutLocked(c *LeaseCall, i int, reason string, emptied bool, now bucket.Instant) {
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
	if emptied {
		lz.call = nil
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
	if emptied {
		lz.checkFlushes()
	}
	lz.wake()
}

// stopLocked stops the machine's calls for good (with lz.mu held, which it
// releases), for the reason stop, which Ready and Close report: retrying
// cannot help. It logs msg, serves the leases, then the fallback policy.
func (lz *leaser) stopLocked(c *LeaseCall, now bucket.Instant, stop error, msg string) {
	lz.dup = stop
	lz.call = nil
	caller := lz.core.Caller()
	lz.mu.Unlock()
	lz.log.Error(msg, "spender_id", caller.ID, "epoch", caller.Epoch, "err", stop)
	lz.giveUp(c, now)
	lz.setFallback(true, stop)
	lz.checkFlushes()
}

// ready is the Limiter's Ready.
func (lz *leaser) ready() error {
	lz.mu.Lock()
	defer lz.mu.Unlock()
	switch {
	case lz.dup != nil:
		return lz.dup
	case lz.fallback():
		return lz.down
	}
	return nil
}

// refusedCredential is the allocator's refusal of this spender's
// credential while it lasts (ErrCredentialRefused), nil otherwise.
func (lz *leaser) refusedCredential() error {
	if !lz.fallback() {
		return nil
	}
	lz.mu.Lock()
	defer lz.mu.Unlock()
	if errors.Is(lz.down, ErrCredentialRefused) {
		return lz.down
	}
	return nil
}

// awaitingAnswer reports whether k is queued for, or carried by, a call
// that has not failed (the caller holds k's shard lock): the allocator is
// slow, not known to be unreachable.
func (lz *leaser) awaitingAnswer(k *lease.Key) bool {
	if !k.Queued() && !k.InCall() {
		return false
	}
	lz.mu.Lock()
	defer lz.mu.Unlock()
	return !lz.core.Failing()
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
	lz.mu.Lock()
	dropped := lz.call != c // the keys are no longer in a call
	lz.mu.Unlock()
	for i, st := range c.keys {
		if dropped {
			sh := st.sh
			sh.mu.Lock()
			st.lk.SetInCall(false)
			sh.mu.Unlock()
		}
		if w := c.waits[i]; w != nil {
			close(w)
			c.waits[i] = nil
		}
	}
}

// finishAcquire applies the answer to c and wakes its waiters.
func (lz *leaser) finishAcquire(c *LeaseCall, resp *leasev1.AcquireResponse, recv bucket.Instant) {
	expiry := c.lc.Sent().Add(leaseTTLOf(resp))
	env := *lz.env.Load()
	for i, st := range c.keys {
		req, g := c.acquire.GetKeys()[i], fromKeyGrant(resp.GetKeys()[i])
		en := lease.Entry{Limits: leasewire.LimitsOf(req.GetLimits()), Need: leasewire.AmountOf(req.GetNeed()), Demand: leasewire.AmountOf(req.GetDemand())}
		sh := st.sh
		sh.mu.Lock()
		st.lk.SetInCall(false)
		env.Apply(st.lk, &en, &g, c.lc.Sent(), expiry, recv)
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

// leaseTTLOf is the lease TTL an Acquire's answer names.
func leaseTTLOf(resp *leasev1.AcquireResponse) time.Duration {
	return time.Duration(resp.GetLeaseTtlUs()) * time.Microsecond
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
	lz.mu.Lock()
	if on {
		lz.down = err
	}
	changed := lz.core.SetFallback(on)
	lz.publishLocked()
	lz.mu.Unlock()
	if changed {
		lz.fallbackSwitched(on, err)
	}
}

// fallbackSwitched logs and counts a switch into the fallback (on, for the
// reason err) or out of it.
func (lz *leaser) fallbackSwitched(on bool, err error) {
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
	due := lz.core.Tick(now)
	lz.mu.Unlock()
	if due {
		lz.maintain(now, false)
	}
}

// nextWake is when the machine next needs to run (lease.Calls.NextWake).
func (lz *leaser) nextWake(now bucket.Instant) bucket.Instant {
	lz.mu.Lock()
	defer lz.mu.Unlock()
	return lz.core.NextWake(now)
}

// maintain scans every key. With force, every key with anything to report
// is queued.
func (lz *leaser) maintain(now bucket.Instant, force bool) {
	env := *lz.env.Load()
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
			lz.accruedLocked(sh, accrued)
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
	lz.core.Urge()
	lz.mu.Unlock()
	lz.checkFlushes()
	lz.wake()
	return ch, nil
}

// checkFlushes releases Flush callers once nothing is queued or in a call.
func (lz *leaser) checkFlushes() {
	lz.mu.Lock()
	defer lz.mu.Unlock()
	if !lz.core.Idle() {
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
			lz.accruedLocked(sh, accrued)
			if ok {
				req.Keys = append(req.Keys, &leasev1.KeyRelease{Key: en.Key, Limits: leasewire.NewLimits(en.Limits),
					Returned: leasewire.NewAmount(en.Returned), Debt: leasewire.NewAmount(en.Debt)})
			}
		}
		sh.mu.Unlock()
	}
	lz.mu.Lock()
	caller := lz.core.Release()
	lz.mu.Unlock()
	req.Caller = &leasev1.Caller{SpenderId: caller.ID, Epoch: caller.Epoch, Sequence: caller.Seq}
	return req
}
