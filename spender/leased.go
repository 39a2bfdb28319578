package spender

import (
	"errors"
	"fmt"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
	"github.com/rationhq/ration/spender/internal/lease"
)

// waiter is a Reserve or ReserveAt that needs the allocator: it asks again
// when ready is closed (the call carrying its key ended), or at deadline,
// when the fallback policy decides.
type waiter struct {
	ready    <-chan struct{}
	deadline bucket.Instant // when to look again without an answer
	limit    bucket.Instant // the latest deadline: SlowPathDeadline + CallTimeout after the first ask
	job      *aheadJob      // ReserveAt: the reservation asked for ahead
}

// reserveLeased decides c for key at now on a leased Limiter, without
// waiting: it admits from the lease, refuses with the wait the allocator
// last named, follows the fallback policy, or, when the allocator must be
// asked, queues the key and returns a waiter (w, or a new one) to ask
// again with. ahead is wait mode (ReserveAt): it returns the time to send.
// The rules for one key are judgeLocked's; the Limiter's own driver and
// the simulator both come here.
func (l *Limiter) reserveLeased(now bucket.Instant, key string, lim ration.Limits, c ration.Amount, maxWait time.Duration, ahead bool, w *waiter) (Reservation, time.Time, *waiter, error) {
	lz := l.lz
	sh, st, err := l.lockKey(key, lim, now)
	if err != nil {
		return nil, time.Time{}, nil, err
	}
	defer sh.mu.Unlock()
	if w == nil {
		// The common case first: a first ask the lease covers.
		if r := lz.tryLeaseLocked(st, c, now); r != nil {
			if !ahead {
				return r, time.Time{}, nil, nil // Reserve has no send time
			}
			return r, l.timeOf(now), nil, nil
		}
	} else if w.job != nil {
		return l.finishAheadLocked(st, c, now, w)
	}
	v, rej, err := lz.judgeLocked(st, c, now, w)
	if err != nil {
		return nil, time.Time{}, nil, err
	}
	if ahead && (v == ask || v == refuse && !rej.Oversize) && !lz.fallback() {
		// Wait mode asks the allocator to reserve ahead even when the
		// allocator last named a wait: that is the wait it asks about.
		job := &aheadJob{st: st, lim: lim, cost: c, maxWait: maxWait, done: make(chan struct{})}
		lz.enqueueAhead(job)
		return nil, time.Time{}, lz.newWaiter(job.done, now, job), nil
	}
	switch v {
	case admitLease:
		path := pathLocal
		if w != nil {
			path = pathSlow
		}
		r := lz.admitLocked(st, c, now, path)
		if !ahead {
			return r, time.Time{}, nil, nil // Reserve has no send time
		}
		return r, l.timeOf(now), nil, nil
	case refuse:
		lz.cfg.metrics.reject(rej)
		if !rej.Oversize {
			st.lk.Refuse(c, now) // demand the key did not meet
		}
		return nil, time.Time{}, nil, rej
	case fallback:
		r, err := lz.fallbackLocked(st, c, now)
		return r, l.timeOf(now), nil, err
	}
	if w == nil {
		w = lz.newWaiter(nil, now, nil)
	}
	w.ready = lz.askLocked(st, c, now)
	return nil, time.Time{}, w, nil
}

// verdict is what the leased path's rules say of one key's cost.
type verdict uint8

const (
	admitLease verdict = iota + 1 // the lease covers the cost
	fallback                      // the allocator counts as unreachable (or is too slow): the fallback policy decides
	refuse                        // refused, with a *RejectError
	ask                           // the allocator must be asked first
)

// judgeLocked applies the leased path's rules to c on st at now (the
// shard locked), changing no budget but crediting the key's share accrued
// so far: the lease covers it; the spender knows when the key can admit it
// (lease.Env.Judge) or the cost can never fit (refuse, with the error); the
// allocator is unreachable, or w is past its deadline without an answer
// under way (the fallback policy decides: fallbackCheckLocked); or the
// allocator must be asked. An error is a key the allocator rejected, or a
// credential it refuses. w is the waiter of a Reserve asking again, nil on
// the first ask; a waiter past its deadline while its call is under way is
// given more time here.
func (lz *leaser) judgeLocked(st *keyState, c ration.Amount, now bucket.Instant, w *waiter) (verdict, *RejectError, error) {
	env := lz.env.Load()
	covered, ref, accrued, err := env.Judge(st.lk, c, now)
	lz.accruedLocked(st.sh, accrued)
	switch {
	case err != nil:
		return 0, nil, err
	case covered:
		return admitLease, nil, nil
	case ref != nil:
		return refuse, rejectError(st, c, ref), nil
	}
	switch {
	case lz.fallback(), w != nil && now >= w.deadline && (now >= w.limit || !lz.awaitingAnswer(st.lk)):
		if err := lz.refusedCredential(); err != nil {
			return 0, nil, err
		}
		return fallback, nil, nil
	case w != nil && now >= w.deadline:
		// Past the slow-path deadline, but the allocator is slow, not
		// unreachable: a false 429 from an empty fallback bucket would be
		// worse than waiting for the call already under way.
		w.deadline = min(w.limit, now.Add(lz.attemptTimeout()))
	}
	return ask, nil, nil
}

// rejectError is the RejectError of the refusal ref of c on st.
func rejectError(st *keyState, c ration.Amount, ref *lease.Refusal) *RejectError {
	return &RejectError{RetryAfter: ref.Wait, Status: leasedStatus(st.Lim, ref.Req, ref.Tok), Dimension: Dimension(ref.Dim),
		Oversize: ref.Oversize, Cost: c}
}

// askLocked queues st for the next Acquire, asking for c too, and returns
// the channel closed when that call ends.
func (lz *leaser) askLocked(st *keyState, c ration.Amount, now bucket.Instant) <-chan struct{} {
	st.lk.Ask(c)
	if st.wait == nil {
		st.wait = make(chan struct{})
	}
	lz.enqueueLocked(st, true, now)
	return st.wait
}

// newWaiter is a waiter first asked at now.
func (lz *leaser) newWaiter(ready <-chan struct{}, now bucket.Instant, job *aheadJob) *waiter {
	tune := lz.cfg.tuning
	return &waiter{ready: ready, deadline: now.Add(tune.SlowPathDeadline), limit: now.Add(tune.SlowPathDeadline + tune.CallTimeout), job: job}
}

// finishAheadLocked decides a ReserveAt whose reservation ahead was asked
// for: the allocator's answer, or, past the deadline or after a failure,
// the fallback policy (now or never).
func (l *Limiter) finishAheadLocked(st *keyState, c ration.Amount, now bucket.Instant, w *waiter) (Reservation, time.Time, *waiter, error) {
	lz, j := l.lz, w.job
	select {
	case <-j.done:
	default:
		if now < w.deadline {
			return nil, time.Time{}, w, nil
		}
		j.abandoned = true // a late reservation is given back
	}
	if errors.Is(j.err, ErrKeyRejected) {
		return nil, time.Time{}, nil, j.err
	}
	if err := lz.refusedCredential(); err != nil {
		return nil, time.Time{}, nil, err
	}
	if j.err != nil || j.abandoned {
		r, err := lz.fallbackLocked(st, c, now)
		return r, l.timeOf(now), nil, err
	}
	at, ref := st.lk.Aheaded(j.res, c, j.recv, now)
	if ref != nil {
		rej := rejectError(st, c, ref)
		lz.cfg.metrics.reject(rej)
		return nil, time.Time{}, nil, rej
	}
	lz.cfg.metrics.admit(pathAhead)
	return newLeasedReservation(st, c, now, pathAhead, 0), l.timeOf(at), nil, nil
}

// tryLeaseLocked admits c from st's lease if the lease covers it (see
// lease.Env.TryAdmit), nil if the leased path's other rules must decide.
func (lz *leaser) tryLeaseLocked(st *keyState, c ration.Amount, now bucket.Instant) Reservation {
	env := lz.env.Load()
	ok, refresh, accrued := env.TryAdmit(st.lk, c, now)
	lz.accruedLocked(st.sh, accrued)
	if !ok {
		return nil
	}
	return lz.admittedLocked(st, c, now, pathLocal, refresh)
}

// admitLocked admits c from st's lease if it is valid and covers c,
// queueing a refresh when the lease falls below its low watermark. It
// returns nil when the lease cannot cover c.
func (lz *leaser) admitLocked(st *keyState, c ration.Amount, now bucket.Instant, path admitPath) Reservation {
	env := lz.env.Load()
	ok, refresh := env.Admit(st.lk, c, now)
	if !ok {
		return nil
	}
	return lz.admittedLocked(st, c, now, path, refresh)
}

// admittedLocked is the Reservation of c, just admitted from st's lease
// at now on path, queueing st for a refresh if the lease asks for one.
func (lz *leaser) admittedLocked(st *keyState, c ration.Amount, now bucket.Instant, path admitPath, refresh bool) Reservation {
	if refresh {
		lz.enqueueLocked(st, false, now)
	}
	lz.cfg.metrics.admit(path)
	return newLeasedReservation(st, c, now, path, st.lk.Gen())
}

// fallbackLocked admits c for a key without a usable lease while the
// allocator is unreachable, if the configured policy does (see
// fallbackCheckLocked). What it admits is recorded as debt, reported when
// the allocator answers again.
func (lz *leaser) fallbackLocked(st *keyState, c ration.Amount, now bucket.Instant) (Reservation, error) {
	m := lz.cfg.metrics
	if rej := lz.fallbackCheckLocked(st, c, now); rej != nil {
		if lz.cfg.policy == FailClosed {
			m.failClosed()
		} else {
			m.reject(rej)
		}
		st.lk.Refuse(c, now)
		return nil, rej
	}
	st.lk.FallbackAdmit(c, now, lease.Policy(lz.cfg.policy))
	st.sh.fallbackAdmits++
	m.admit(pathFallback)
	lz.logFallback(st.key, now)
	return newLeasedReservation(st, c, now, pathFallback, 0), nil
}

// fallbackCheckLocked is the fallback policy's answer for c now, nil to
// admit (see lease.Env.FallbackCheck).
func (lz *leaser) fallbackCheckLocked(st *keyState, c ration.Amount, now bucket.Instant) *RejectError {
	if !lz.fallback() {
		// A request that waited for the allocator as long as it may
		// (SlowPathDeadline + CallTimeout), or whose call was given up:
		// the allocator is not serving this spender, whatever its calls
		// say yet. Ready, /readyz and the fallback gauge say so until a
		// call is answered.
		lz.setFallback(true, fmt.Errorf("%w: a request got no answer in time (slow-path deadline %v plus call timeout %v)",
			ErrAllocatorUnreachable, lz.cfg.tuning.SlowPathDeadline, lz.cfg.tuning.CallTimeout))
	}
	env := lz.env.Load()
	if ref := env.FallbackCheck(st.lk, c, now, lease.Policy(lz.cfg.policy), lz.maxActive.Load()); ref != nil {
		return rejectError(st, c, ref)
	}
	return nil
}

// leasedStatus is the Status of a key with limits lim and req requests and
// tok tokens remaining: each limited dimension's capacity, what remains,
// and how long its global bucket takes to refill from there.
func leasedStatus(lim ration.Limits, req, tok int64) Status {
	windowUs := float64(lim.Period() / time.Microsecond)
	dim := func(rate, limit, remaining int64) (int64, int64, time.Duration) {
		if remaining >= limit {
			return limit, remaining, 0
		}
		return limit, remaining, time.Duration(float64(limit-remaining)*windowUs/float64(rate)) * time.Microsecond
	}
	var s Status
	capacity := lim.Capacity()
	if lim.RPM > 0 {
		s.LimitRequests, s.RemainingRequests, s.ResetRequests = dim(lim.RPM, capacity.Requests, req)
	}
	if lim.TPM > 0 {
		s.LimitTokens, s.RemainingTokens, s.ResetTokens = dim(lim.TPM, capacity.Tokens, tok)
	}
	return s
}

// leasedReservation is a leased Limiter's Reservation.
type leasedReservation struct {
	st    *keyState
	basis *lease.Basis // the key's limits and snapshot at admission
	cost  ration.Amount
	avail ration.Amount  // the lease right after admission; with basis and at, the Status
	at    bucket.Instant // the admission
	gen   uint32         // the lease generation it was admitted from
	path  admitPath
	done  bool // guarded by st.sh.mu
}

// newLeasedReservation returns the Reservation for c, admitted at now on
// path from lease generation gen. Call it with the shard locked, after the
// spend. It keeps what its Status needs, computed when asked.
func newLeasedReservation(st *keyState, c ration.Amount, now bucket.Instant, path admitPath, gen uint32) *leasedReservation {
	return &leasedReservation{st: st, basis: st.lk.Basis(), cost: c, avail: st.lk.Avail(), at: now, path: path, gen: gen}
}

// Status is the key's status right after the admission.
func (r *leasedReservation) Status() Status {
	req, tok := r.basis.Remaining(r.avail, r.at)
	return leasedStatus(r.basis.Lim, req, tok)
}

func (r *leasedReservation) Cancel() { r.settle(ration.Amount{}, true) }

func (r *leasedReservation) Settle(actual ration.Amount) { r.settle(actual, false) }

// settle applies the actual usage. It reads no clock: a refund needs none,
// and a fallback overrun is taken from the fallback buckets as of their
// last refill (the next admission refills them).
func (r *leasedReservation) settle(actual ration.Amount, cancel bool) {
	actual = actual.Clamp()
	st := r.st
	sh := st.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if r.done {
		return
	}
	r.done = true
	if !cancel {
		sh.l.lz.cfg.metrics.usage(r.cost.Tokens, actual.Tokens)
	}
	switch r.path {
	case pathFallback:
		st.lk.SettleFallback(r.cost, actual)
	case pathAhead:
		st.lk.SettleAhead(r.cost, actual)
	default:
		st.lk.Settle(r.cost, actual, r.gen)
	}
}
