package spender

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
	"github.com/rationhq/ration/spender/internal/lease"
)

// Limiter enforces each key's RPM and TPM budgets. It is safe for
// concurrent use by many goroutines; keys are spread over lock shards, so
// requests for different keys rarely contend and no decision takes a global
// lock.
//
// The verbs form one family:
//   - Reserve admits a cost now or returns a *RejectError with the exact
//     wait. Most HTTP callers want this: they answer 429 with Retry-After.
//   - ReserveAt is wait mode: it answers with the time the caller may send
//     (now, or later), reserving at once so the next caller sees it, and
//     refuses without reserving when that time is further than maxWait.
//   - The returned Reservation is settled with the actual usage (Settle) or
//     returned whole (Cancel) once the response is known; exactly one of
//     the two counts.
//
// A key's limits come with every call; a dimension with rate 0 is
// unlimited. Bad input (an empty or over-long key, a negative cost, limits
// that are negative or too large for exact arithmetic) gets an error
// wrapping ErrInvalidKey, ErrInvalidCost or ErrInvalidLimits and changes no
// state. Memory is bounded by the keys active within the last
// refill-to-full period (see WithSweepInterval).
type Limiter struct {
	clock    ration.Clock
	sysClock bool      // clock is ration.SystemClock (see now)
	epoch    time.Time // Instant 0; taken from the clock at New
	seed     maphash.Seed
	shards   []shard
	mask     uint64
	sweep    time.Duration
	lz       *leaser // the lease state machine; nil for a standalone Limiter
	drv      *driver // moves lz; nil for a standalone Limiter
}

// shard is one lock and the keys hashed to it.
type shard struct {
	l  *Limiter
	mu sync.Mutex // guards everything below and every keyState in keys
	// keys holds the state of every key with a bucket that is not full (or
	// a lease state that holds something) and, until the next sweep, some
	// that are full or idle again.
	keys     keyTable
	sweepAt  bucket.Instant // sweep when the clock reaches this
	sweepLen int            // or when keys.n reaches this
	// Leased: what the shard's keys' shares credited to their leases, and
	// their admissions under the fallback policy (Machine.Counts).
	accrued        ration.Amount
	fallbackAdmits int64
}

const minSweepLen = 64

// New returns a Limiter that reads the time from clock (nil means
// SystemClock). By default it is standalone: it keeps every key's whole
// budget in this process. With WithLeases it spends leases from an
// allocator instead, so that many Limiters share each key's global budget;
// such a Limiter must be closed with Close. An invalid option is an error
// wrapping ErrInvalidOption that names it; nothing is started then.
func New(clock ration.Clock, opts ...Option) (*Limiter, error) {
	if clock == nil {
		clock = ration.SystemClock{}
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o.apply(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	shards := roundShards(cfg.shards)
	_, sys := clock.(ration.SystemClock)
	l := &Limiter{
		clock:    clock,
		sysClock: sys,
		epoch:    clock.Now(),
		seed:     maphash.MakeSeed(),
		shards:   make([]shard, shards),
		mask:     uint64(shards - 1),
		sweep:    cfg.sweep,
	}
	for i := range l.shards {
		l.shards[i] = shard{l: l, sweepAt: bucket.Instant(0).Add(cfg.sweep), sweepLen: minSweepLen}
	}
	if cfg.lease.leased {
		l.lz = newLeaser(l, cfg.lease, 0)
		l.drv = startDriver(l, cfg.lease.src)
	}
	return l, nil
}

// Reserve admits cost c for key now, or returns a *RejectError carrying the
// exact wait until c is covered in every dimension (RetryAfter) and the
// key's status. A cost above a bucket's capacity is rejected with Oversize
// set and no RetryAfter. It never blocks and never touches the network.
// ctx is not consulted by the standalone Limiter.
func (l *Limiter) Reserve(ctx context.Context, key string, lim ration.Limits, c ration.Amount) (Reservation, error) {
	r, _, err := l.reserve(ctx, key, lim, c, 0, false)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// ReserveAt is wait mode: it reserves c for key at the earliest
// time it is covered and returns that time (the clock's now when it already
// is). The reservation is made at once, so the key's level may go negative
// and the next caller is told a later time. When the time would be later
// than now+maxWait, ReserveAt reserves nothing and returns a *RejectError
// whose RetryAfter is the wait that would have been needed. A negative
// maxWait counts as 0.
func (l *Limiter) ReserveAt(ctx context.Context, key string, lim ration.Limits, c ration.Amount, maxWait time.Duration) (Reservation, time.Time, error) {
	r, at, err := l.reserve(ctx, key, lim, c, max(0, maxWait), true)
	if err != nil {
		return nil, time.Time{}, err
	}
	return r, at, nil
}

// reserve is Reserve (maxWait 0) and ReserveAt.
func (l *Limiter) reserve(ctx context.Context, key string, lim ration.Limits, c ration.Amount, maxWait time.Duration, ahead bool) (Reservation, time.Time, error) {
	if err := ration.ValidKey(key); err != nil {
		return nil, time.Time{}, fmt.Errorf("%w: %w", ErrInvalidKey, err)
	}
	if c.Requests < 0 || c.Tokens < 0 {
		return nil, time.Time{}, fmt.Errorf("%w: %+v has a negative field", ErrInvalidCost, c)
	}
	if lim.RPM == 0 && lim.TPM == 0 {
		if lim.BurstRequests < 0 || lim.BurstTokens < 0 {
			return nil, time.Time{}, lim.Validate()
		}
		if ahead {
			return unlimited{}, l.clock.Now(), nil
		}
		return unlimited{}, time.Time{}, nil
	}
	if l.lz != nil {
		return l.drv.reserve(ctx, key, lim, c, maxWait, ahead)
	}
	inst := l.now()
	sh, st, err := l.lockKey(key, lim, inst)
	if err != nil {
		return nil, time.Time{}, err
	}
	st.Advance(inst)
	w, dim, fits := st.Wait(c)
	if !fits || w > maxWait {
		rej := &RejectError{RetryAfter: w, Status: st.status(), Dimension: Dimension(dim), Oversize: !fits, Cost: c}
		sh.mu.Unlock()
		return nil, time.Time{}, rej
	}
	r := &reservation{}
	st.admit(r, c)
	sh.mu.Unlock()
	if !ahead {
		return r, time.Time{}, nil
	}
	return r, l.timeOf(inst).Add(w), nil
}

// now reads the clock once and returns the instant. With the system clock
// it reads only the monotonic clock (time.Since): time.Now also reads the
// wall clock, which cost a leased Reserve+Settle about 14% of its time.
func (l *Limiter) now() bucket.Instant {
	if l.sysClock {
		return bucket.Instant(time.Since(l.epoch) / time.Microsecond)
	}
	return bucket.InstantOf(l.epoch, l.clock.Now())
}

// timeOf is the clock time of instant i.
func (l *Limiter) timeOf(i bucket.Instant) time.Time { return i.Time(l.epoch) }

// lockKey locks key's shard, sweeps it when due, and returns the shard and
// key's state with the shard still locked; on error the shard is unlocked.
func (l *Limiter) lockKey(key string, lim ration.Limits, now bucket.Instant) (*shard, *keyState, error) {
	h := maphash.String(l.seed, key)
	sh := &l.shards[h&l.mask]
	sh.mu.Lock()
	if now >= sh.sweepAt || sh.keys.n >= sh.sweepLen {
		sh.sweepLocked(now)
	}
	st, err := sh.lookupLocked(h, key, lim, now)
	if err != nil {
		sh.mu.Unlock()
		return nil, nil, err
	}
	return sh, st, nil
}

// lookupLocked returns key's state, creating it or making it follow
// changed limits. It validates limits only when they differ from the
// stored ones, so the steady state pays one comparison. A standalone key
// starts with full buckets; a leased key starts holding no lease and only
// records new limits (the allocator follows the latest it is sent). h is
// key's hash.
func (sh *shard) lookupLocked(h uint64, key string, lim ration.Limits, now bucket.Instant) (*keyState, error) {
	st := sh.keys.get(h, key)
	if st != nil && st.Lim == lim {
		return st, nil
	}
	if err := lim.Validate(); err != nil {
		return nil, err
	}
	switch {
	case st == nil && sh.l.lz != nil:
		st = &keyState{sh: sh, key: key, Buckets: lease.Buckets{Lim: lim}, lk: lease.NewKey(key, lim, now)}
		sh.keys.set(h, st)
	case st == nil:
		st = newKeyState(sh, key, lim, now)
		sh.keys.set(h, st)
	case st.lk != nil:
		st.Lim = lim
		st.lk.SetLimits(lim) // a new question for the allocator
	default:
		st.setLimits(lim, now)
	}
	return st, nil
}

// sweepLocked drops the state of every key in sh that carries no
// information at now, and schedules the next sweep.
func (sh *shard) sweepLocked(now bucket.Instant) {
	sh.keys.rebuild(func(st *keyState) bool {
		st.dead = st.droppable(now)
		return !st.dead
	})
	sh.sweepAt = now.Add(sh.l.sweep)
	sh.sweepLen = max(2*sh.keys.n, minSweepLen)
}

// Keys returns the number of keys whose state the Limiter currently holds.
// Keys whose buckets are full are dropped at the next sweep, so this is
// bounded by the keys active in the last refill-to-full period plus the
// sweep interval.
func (l *Limiter) Keys() int {
	n := 0
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		n += sh.keys.n
		sh.mu.Unlock()
	}
	return n
}

// Flush sends a leased Limiter's pending debts and returns to the allocator
// now and waits for the answer; it does nothing for a standalone Limiter.
// It returns ErrClosed after Close, or ctx's error.
func (l *Limiter) Flush(ctx context.Context) error {
	if l.lz == nil {
		return nil
	}
	return l.drv.flush(ctx)
}

// Ready reports whether a leased Limiter is served by its allocator: nil
// unless the allocator counts as unreachable (an error wrapping
// ErrAllocatorUnreachable and the last failure, until a call is answered
// again) or another live process uses its spender id (ErrDuplicateSpender,
// until Close). A standalone Limiter is always ready. Ready makes no call.
func (l *Limiter) Ready() error {
	if l.lz == nil {
		return nil
	}
	return l.lz.ready()
}

// Close stops a leased Limiter's background work and gives back every
// unspent lease to the allocator (one Release call, retried until ctx
// ends). Reservations still outstanding can be settled afterwards but
// their refunds are not returned. Close on a standalone Limiter does
// nothing. It is safe to call more than once.
func (l *Limiter) Close(ctx context.Context) error {
	if l.lz == nil {
		return nil
	}
	return l.drv.close(ctx)
}

// admit takes c from st's buckets (the shard locked) and makes r its
// reservation.
func (st *keyState) admit(r *reservation, c ration.Amount) {
	st.Take(c)
	*r = reservation{sh: st.sh, st: st, kl: st.kl, cost: c}
	r.lvl[0], r.lvl[1] = st.Levels()
}

// reservation is a standalone Limiter's Reservation.
type reservation struct {
	sh   *shard     // st.sh, kept here so that settling reads one cache line less
	st   *keyState  // may be dropped (dead) by a sweep before settlement
	kl   *keyLimits // the key's limits at admission
	cost ration.Amount
	lvl  [2]int64 // the buckets' levels right after admission; with kl, the Status
	done bool     // guarded by st.sh.mu
}

func (r *reservation) Status() Status { return r.kl.status(r.lvl[0], r.lvl[1]) }

func (r *reservation) Cancel() { r.Settle(ration.Amount{}) }

func (r *reservation) Settle(actual ration.Amount) {
	actual.Requests, actual.Tokens = max(0, actual.Requests), max(0, actual.Tokens)
	refund := ration.Amount{Requests: r.cost.Requests - actual.Requests, Tokens: r.cost.Tokens - actual.Tokens}
	sh := r.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if r.done {
		return
	}
	r.done = true
	st := r.st
	overrun := refund.Requests < 0 || refund.Tokens < 0
	if !overrun && !st.dead {
		// Giving back needs no refill first (see bucket.Give), so the
		// common settlement reads no clock.
		st.Give(refund)
		return
	}
	// An overrun is charged at the current instant, after the refill up to
	// it. A state dropped by a sweep was full; the key's live state (made
	// anew, full, if there is none) is where the adjustment belongs.
	now := sh.l.now()
	if st.dead {
		h := st.hash()
		live := sh.keys.get(h, st.key)
		if live == nil {
			live = newKeyState(sh, st.key, st.Lim, now) // st.Lim was validated when stored
			sh.keys.set(h, live)
		}
		st = live
	}
	if overrun {
		st.Advance(now)
	}
	// Each dimension is either refunded or charged, never both.
	st.Give(ration.Amount{Requests: max(0, refund.Requests), Tokens: max(0, refund.Tokens)})
	st.Take(ration.Amount{Requests: max(0, -refund.Requests), Tokens: max(0, -refund.Tokens)})
}

// unlimited is the Reservation for a key with no limited dimension: it
// holds nothing and its Status is all zeros.
type unlimited struct{}

func (unlimited) Settle(ration.Amount) {}
func (unlimited) Cancel()              {}
func (unlimited) Status() Status       { return Status{} }
