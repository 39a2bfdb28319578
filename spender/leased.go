package spender

import (
	"errors"
	"fmt"
	"math/bits"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
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

// oversize reports whether c can never fit lim, and in which dimension.
func oversize(lim ration.Limits, c ration.Amount) (Dimension, bool) {
	capacity := lim.Capacity()
	if lim.RPM > 0 && c.Requests > capacity.Requests {
		return Requests, true
	}
	if lim.TPM > 0 && c.Tokens > capacity.Tokens {
		return Tokens, true
	}
	return 0, false
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
	if w != nil && w.job != nil {
		return l.finishAheadLocked(st, c, now, w)
	}
	v, rej, err := lz.judgeLocked(st, c, now, w)
	if err != nil {
		return nil, time.Time{}, nil, err
	}
	if ahead && (v == ask || v == refuse && !rej.Oversize) && !lz.fallback.Load() {
		// Wait mode asks the allocator to reserve ahead even when the
		// allocator last named a wait: that is the wait it asks about.
		job := &aheadJob{st: st, lim: lim, cost: c, maxWait: maxWait, done: make(chan struct{})}
		lz.mu.Lock()
		lz.aheads = append(lz.aheads, job)
		lz.urgent = true
		lz.mu.Unlock()
		lz.wake()
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
			st.ls.refuse(lim, c, now) // demand the key did not meet
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
// (refusalLocked) or the cost can never fit (refuse, with the error); the
// allocator is unreachable, or w is past its deadline without an answer
// under way (the fallback policy decides: fallbackCheckLocked); or the
// allocator must be asked. An error is a key the allocator rejected, or a
// credential it refuses. w is the waiter of a Reserve asking again, nil on
// the first ask; a waiter past its deadline while its call is under way is
// given more time here.
func (lz *leaser) judgeLocked(st *keyState, c ration.Amount, now bucket.Instant, w *waiter) (verdict, *RejectError, error) {
	ls, lim := st.ls, st.lim
	if ls.rejected != nil {
		return 0, nil, ls.rejected
	}
	if dim, big := oversize(lim, c); big {
		return refuse, ls.rejection(lim, c, dim, 0, now), nil
	}
	lz.accrueLocked(st, now)
	if ls.valid(now) && ls.covers(lim, c) {
		return admitLease, nil, nil
	}
	if rej := lz.refusalLocked(st, c, now); rej != nil {
		return refuse, rej, nil
	}
	switch {
	case lz.fallback.Load(), w != nil && now >= w.deadline && (now >= w.limit || !lz.awaitingAnswer(ls)):
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

// askLocked queues st for the next Acquire, asking for c too, and returns
// the channel closed when that call ends.
func (lz *leaser) askLocked(st *keyState, c ration.Amount, now bucket.Instant) <-chan struct{} {
	ls := st.ls
	lc := st.lim.Limited(c)
	ls.waitMax = ls.waitMax.Max(lc)
	ls.waitSum = ls.waitSum.Add(lc)
	if ls.wait == nil {
		ls.wait = make(chan struct{})
	}
	lz.enqueueLocked(st, true, now)
	return ls.wait
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
	lz, ls, lim, j := l.lz, st.ls, st.lim, w.job
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
	kr := j.res
	ls.setSnapshot(kr.GetSnapshot(), now)
	wait := time.Duration(kr.GetWaitUs()) * time.Microsecond
	switch kr.GetStatus() {
	case leasev1.GrantStatus_GRANT_STATUS_OK:
		lc := lim.Limited(c)
		ls.outstanding = ls.outstanding.Add(lc)
		ls.record(lc, now)
		lz.cfg.metrics.admit(pathAhead)
		return ls.reservation(st, c, now, pathAhead, 0), l.timeOf(j.recv.Add(wait)), nil, nil
	case leasev1.GrantStatus_GRANT_STATUS_TOO_LARGE:
		rej := ls.rejection(lim, c, 0, 0, now)
		lz.cfg.metrics.reject(rej)
		return nil, time.Time{}, nil, rej
	}
	dim := Tokens
	if lim.TPM == 0 {
		dim = Requests
	}
	rej := ls.rejection(lim, c, dim, wait, now)
	lz.cfg.metrics.reject(rej)
	return nil, time.Time{}, nil, rej
}

// admitLocked admits c from st's lease if it is valid and covers c,
// queueing a refresh when the lease falls below its low watermark. It
// returns nil when the lease cannot cover c.
func (lz *leaser) admitLocked(st *keyState, c ration.Amount, now bucket.Instant, path admitPath) Reservation {
	ls := st.ls
	if !ls.valid(now) || !ls.covers(st.lim, c) {
		return nil
	}
	ls.spend(st.lim, c, now)
	if !ls.queued && !ls.inCall && ls.low(st.lim, c) && (ls.ss == nil || !lz.shareRefills(st, c, now)) {
		lz.enqueueLocked(st, false, now)
	}
	lz.cfg.metrics.admit(path)
	return ls.reservation(st, c, now, path, ls.gen)
}

// fallbackLocked admits c for a key without a usable lease while the
// allocator is unreachable, if the configured policy does (see
// fallbackCheckLocked). What it admits is recorded as debt, reported when
// the allocator answers again.
func (lz *leaser) fallbackLocked(st *keyState, c ration.Amount, now bucket.Instant) (Reservation, error) {
	ls, m := st.ls, lz.cfg.metrics
	if rej := lz.fallbackCheckLocked(st, c, now); rej != nil {
		if lz.cfg.policy == FailClosed {
			m.failClosed()
		} else {
			m.reject(rej)
		}
		ls.refuse(st.lim, c, now)
		return nil, rej
	}
	if lz.cfg.policy == FallbackShare {
		fb := keyState{lim: ls.fbLim, req: st.req, tok: st.tok}
		fb.take(c)
		st.req, st.tok = fb.req, fb.tok
	}
	lc := st.lim.Limited(c)
	ls.debt = ls.debt.Add(lc)
	ls.record(lc, now)
	m.admit(pathFallback)
	lz.logFallback(st.key, now)
	return ls.reservation(st, c, now, pathFallback, 0), nil
}

// fallbackCheckLocked is the fallback policy's answer for c now, nil to
// admit: FailClosed refuses, FailOpen admits, FallbackShare admits what
// this spender's share of the key's limits covers (see fallbackFrom).
func (lz *leaser) fallbackCheckLocked(st *keyState, c ration.Amount, now bucket.Instant) *RejectError {
	ls := st.ls
	if !lz.fallback.Load() {
		// A request that waited for the allocator as long as it may
		// (SlowPathDeadline + CallTimeout), or whose call was given up:
		// the allocator is not serving this spender, whatever its calls
		// say yet. Ready, /readyz and the fallback gauge say so until a
		// call is answered.
		lz.setFallback(true, fmt.Errorf("%w: a request got no answer in time (slow-path deadline %v plus call timeout %v)",
			ErrAllocatorUnreachable, lz.cfg.tuning.SlowPathDeadline, lz.cfg.tuning.CallTimeout))
	}
	switch lz.cfg.policy {
	case FailClosed:
		return ls.rejection(st.lim, c, Requests, time.Second, now)
	case FailOpen:
		return nil
	}
	n := ls.active
	if n == 0 {
		n = max(1, lz.maxActive.Load())
	}
	var own ration.Share
	if ls.ss != nil {
		own = ls.ss.share
	}
	share := fallbackShareOf(st.lim, own, ls.snapShared, int64(n))
	if !ls.fallback || ls.fbLim != share {
		// Full at the instant the key stopped getting refill from the
		// allocator, then down to its part of what the global buckets held.
		fresh := newKeyState(st.sh, st.key, share, ls.fallbackFrom(now)) // a bucket holder, never linked
		fresh.take(share.Capacity().Sub(fallbackStart(st.lim, share, ls.snapRem)))
		st.req, st.tok = fresh.req, fresh.tok
		ls.fallback, ls.fbLim = true, share
	}
	fb := keyState{lim: share, req: st.req, tok: st.tok}
	fb.advance(now)
	st.req, st.tok = fb.req, fb.tok
	w, dim, fits := fb.wait(c)
	if !fits {
		w = time.Second // above this spender's share: try again when the allocator is back
	}
	if w > 0 {
		return ls.rejection(st.lim, c, dim, w, now)
	}
	return nil
}

// fallbackShareOf is this spender's part of lim while the allocator is
// unreachable: per dimension, its own refill share (own, from its last
// answer) plus an even part, among the n active spenders, of the rate no
// share took (shared, as that answer reported). Without shares it is lim
// divided among n. Every spender doing this takes the rate between them
// (as of their answers), and a busy spender beside idle ones keeps what
// its demand was given. At least 1 per limited dimension.
func fallbackShareOf(lim ration.Limits, own, shared ration.Share, n int64) ration.Limits {
	part := func(v int64, own, shared uint32) int64 {
		if v == 0 {
			return 0
		}
		unshared := uint64(ration.ShareUnit - min(shared, ration.ShareUnit))
		m := uint64(min(max(n, 1), 1<<32)) // so that ShareUnit × m fits
		return max(1, scale(v, min(uint64(own)*m+unshared, ration.ShareUnit*m), ration.ShareUnit*m))
	}
	capacity := lim.Capacity()
	return ration.Limits{
		RPM: part(lim.RPM, own.Requests, shared.Requests), TPM: part(lim.TPM, own.Tokens, shared.Tokens),
		BurstRequests: part(capacity.Requests, own.Requests, shared.Requests),
		BurstTokens:   part(capacity.Tokens, own.Tokens, shared.Tokens),
		Window:        lim.Window,
	}
}

// fallbackStart is what fallback buckets at part (fallbackShareOf of lim)
// start with, per dimension: that part of rem, what the key's global
// buckets held at the last answer. While every spender falls back from its
// own part the fleet starts with at most what the global buckets held, and
// each spender with at most its part's capacity.
func fallbackStart(lim, part ration.Limits, rem ration.Amount) ration.Amount {
	c, pc := lim.Capacity(), part.Capacity()
	of := func(rem, c, pc int64) int64 {
		if rem <= 0 || c <= 0 {
			return 0
		}
		return min(pc, scale(min(rem, c), uint64(min(pc, c)), uint64(c)))
	}
	return ration.Amount{Requests: of(rem.Requests, c.Requests, pc.Requests), Tokens: of(rem.Tokens, c.Tokens, pc.Tokens)}
}

// scale is v × num / den rounded down, for 0 <= v and num <= den (so the
// quotient fits), without overflow.
func scale(v int64, num, den uint64) int64 {
	hi, lo := bits.Mul64(uint64(v), num)
	q, _ := bits.Div64(hi, lo, den)
	return int64(q)
}

// leasedReservation is a leased Limiter's Reservation.
type leasedReservation struct {
	st   *keyState
	kl   *keyLimits // the key's limits at admission
	cost ration.Amount
	rem  [2]int64 // requests and tokens remaining right after admission; with kl, the Status
	gen  uint32   // the lease generation it was admitted from
	path admitPath
	done bool // guarded by st.sh.mu
}

// reservation returns the Reservation for c, admitted at now on path from
// lease generation gen. Call it with the shard locked, after the spend.
func (ls *leaseState) reservation(st *keyState, c ration.Amount, now bucket.Instant, path admitPath, gen uint32) *leasedReservation {
	r := &leasedReservation{st: st, kl: st.kl, cost: c, path: path, gen: gen}
	r.rem[0], r.rem[1] = ls.remaining(st.lim, now)
	return r
}

func (r *leasedReservation) Status() Status { return leasedStatus(r.kl.lim, r.rem[0], r.rem[1]) }

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
	m := sh.l.lz.cfg.metrics
	if !cancel {
		m.usage(r.cost.Tokens, actual.Tokens)
	}
	ls, lim := st.ls, st.lim
	switch r.path {
	case pathFallback:
		ls.debt = ls.debt.Add(lim.Limited(actual).Sub(lim.Limited(r.cost))).Positive()
		if ls.fallback {
			fb := keyState{lim: ls.fbLim, req: st.req, tok: st.tok}
			refund := r.cost.Sub(actual)
			fb.give(refund.Positive())
			fb.take(ration.Amount{}.Sub(refund).Positive())
			st.req, st.tok = fb.req, fb.tok
		}
	case pathAhead:
		// The reservation was made at the allocator for a send time that
		// the local lease does not cover: a refund goes back to the
		// allocator on the next call, an overrun is debt.
		rc, ac := lim.Limited(r.cost), lim.Limited(actual)
		ls.outstanding = ls.outstanding.Sub(rc).Positive()
		d := rc.Sub(ac)
		ls.ret = ls.ret.Add(d.Positive())
		ls.debt = ls.debt.Add(ration.Amount{}.Sub(d).Positive())
	default:
		ls.settle(lim, r.cost, actual, r.gen)
	}
}
