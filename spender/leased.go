package spender

import (
	"context"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

// oversize reports whether c can never fit lim, and in which dimension.
func oversize(lim ration.Limits, c ration.Amount) (Dimension, bool) {
	if lim.RPM > 0 && c.Requests > capacityOf(lim.RPM, lim.BurstRequests) {
		return Requests, true
	}
	if lim.TPM > 0 && c.Tokens > capacityOf(lim.TPM, lim.BurstTokens) {
		return Tokens, true
	}
	return 0, false
}

// reserveLeased is Reserve and ReserveAt (ahead) on a leased Limiter.
func (l *Limiter) reserveLeased(ctx context.Context, h uint64, key string, lim ration.Limits, c ration.Amount, maxWait time.Duration, ahead bool) (Reservation, time.Time, error) {
	lz := l.lz
	inst := l.now()
	var now time.Time // the send time, only wait mode reads it
	if ahead {
		now = l.timeOf(inst)
	}
	sh, st, err := l.lockKey(h, key, lim, inst)
	if err != nil {
		return nil, time.Time{}, err
	}
	ls := leaseOf(st)
	if dim, big := oversize(lim, c); big {
		rej := &RejectError{Status: ls.status(lim, inst), Dimension: dim, Oversize: true, Cost: c}
		sh.mu.Unlock()
		lz.cfg.metrics.reject(rej)
		return nil, time.Time{}, rej
	}
	if r := l.admitLeaseLocked(sh, st, c, inst, pathLocal); r != nil {
		sh.mu.Unlock()
		return r, now, nil
	}
	if ahead && !lz.cfg.manual {
		sh.mu.Unlock()
		return l.reserveAhead(ctx, st, lim, c, maxWait)
	}
	if ls.notBefore > inst {
		rej := &RejectError{RetryAfter: ls.notBefore.Sub(inst), Status: ls.status(lim, inst), Dimension: ls.shortDim, Cost: c}
		sh.mu.Unlock()
		lz.cfg.metrics.reject(rej)
		return nil, time.Time{}, rej
	}
	if lz.fallback.Load() {
		r, err := l.fallbackLocked(st, c, inst)
		sh.mu.Unlock()
		return r, now, err
	}
	if lz.cfg.manual {
		r, err := l.pendingLocked(st, lim, c, inst)
		sh.mu.Unlock()
		return r, now, err
	}
	sh.mu.Unlock()
	return l.slowPath(ctx, st, lim, c)
}

// pendingLocked is the slow path of manual leasing: queue the key and
// return ErrLeasePending, until the key has waited longer than the
// slow-path deadline, when the fallback policy decides.
func (l *Limiter) pendingLocked(st *keyState, lim ration.Limits, c ration.Amount, now bucket.Instant) (Reservation, error) {
	ls := st.ls
	if ls.hasPending && now.Sub(ls.pending) >= l.lz.cfg.slowDeadline {
		return l.fallbackLocked(st, c, now)
	}
	if !ls.hasPending {
		ls.pending, ls.hasPending = now, true
	}
	lc := limitedPart(lim, c)
	ls.waitMax = ration.Amount{Requests: max(ls.waitMax.Requests, lc.Requests), Tokens: max(ls.waitMax.Tokens, lc.Tokens)}
	ls.waitSum = add(ls.waitSum, lc)
	l.lz.enqueueLocked(st, true)
	return nil, ErrLeasePending
}

// slowPath asks the allocator for what c lacks, once per round for all the
// requests waiting on the key, and admits or rejects with the wait the
// allocator named; when others spent the grant first it asks again, all
// within the slow-path deadline, after which the fallback policy decides.
func (l *Limiter) slowPath(ctx context.Context, st *keyState, lim ration.Limits, c ration.Amount) (Reservation, time.Time, error) {
	lz, sh, ls := l.lz, st.sh, st.ls
	deadline := time.NewTimer(lz.cfg.slowDeadline)
	defer deadline.Stop()
	for {
		select {
		case <-lz.done:
			return nil, time.Time{}, ErrClosed
		default:
		}
		sh.mu.Lock()
		lc := limitedPart(lim, c)
		ls.waitMax = ration.Amount{Requests: max(ls.waitMax.Requests, lc.Requests), Tokens: max(ls.waitMax.Tokens, lc.Tokens)}
		ls.waitSum = add(ls.waitSum, lc)
		if ls.wait == nil {
			ls.wait = make(chan struct{})
		}
		wait := ls.wait
		lz.enqueueLocked(st, true)
		sh.mu.Unlock()

		// One waiter per key and round watches the channel (singleflight).
		ch := lz.sf.DoChan(st.key, func() (any, error) {
			select {
			case <-wait:
			case <-lz.done:
			}
			return nil, nil
		})
		answered := false
		select {
		case <-ch:
			answered = true
		case <-deadline.C:
		case <-ctx.Done():
			return nil, time.Time{}, ctx.Err()
		}

		inst := l.now()
		now := l.timeOf(inst)
		sh.mu.Lock()
		if st.dead { // swept while we waited: start again on the key's live state
			sh.mu.Unlock()
			return l.reserveLeased(ctx, st.hash(), st.key, lim, c, 0, false)
		}
		if r := l.admitLeaseLocked(sh, st, c, inst, pathSlow); r != nil {
			sh.mu.Unlock()
			return r, now, nil
		}
		var rej *RejectError
		switch {
		case ls.tooLarge:
			dim, _ := oversize(lim, c)
			rej = &RejectError{Status: ls.status(lim, inst), Dimension: dim, Oversize: true, Cost: c}
		case ls.notBefore > inst:
			rej = &RejectError{RetryAfter: ls.notBefore.Sub(inst), Status: ls.status(lim, inst), Dimension: ls.shortDim, Cost: c}
		case !answered || lz.fallback.Load():
			r, err := l.fallbackLocked(st, c, inst)
			sh.mu.Unlock()
			return r, now, err
		}
		sh.mu.Unlock()
		if rej != nil {
			lz.cfg.metrics.reject(rej)
			return nil, time.Time{}, rej
		}
		// Granted, but other requests spent it first: ask again.
	}
}

// admitLeaseLocked admits c from st's lease if it is valid and covers c,
// starting a refresh when the lease falls below its low watermark. It
// returns nil when the lease cannot cover c.
func (l *Limiter) admitLeaseLocked(sh *shard, st *keyState, c ration.Amount, now bucket.Instant, path admitPath) Reservation {
	ls := leaseOf(st)
	if !ls.valid(now) || !ls.covers(st.lim, c) {
		return nil
	}
	ls.spend(st.lim, c, now)
	if !ls.queued && !ls.inCall && ls.low(st.lim, c) {
		l.lz.enqueueLocked(st, false)
	}
	l.lz.cfg.metrics.admit(path)
	return ls.reservation(sh, st, c, now, path, ls.gen)
}

// fallbackLocked decides c for a key without a usable lease while the
// allocator is unreachable, per the configured policy. What it admits is
// recorded as debt, reported when the allocator answers again.
func (l *Limiter) fallbackLocked(st *keyState, c ration.Amount, now bucket.Instant) (Reservation, error) {
	ls, m := st.ls, l.lz.cfg.metrics
	switch l.lz.cfg.policy {
	case FailClosed:
		rej := &RejectError{RetryAfter: time.Second, Status: ls.status(st.lim, now), Dimension: Requests, Cost: c}
		if m != nil {
			m.rejectedClosed.Inc()
		}
		return nil, rej
	case FailOpen:
	default: // FallbackShare
		n := ls.active
		if n == 0 {
			n = max(1, l.lz.maxActive.Load())
		}
		share := shareOf(st.lim, int64(n))
		if !ls.fallback || ls.fbLim != share {
			// Buckets at the share that start empty: the global bucket was
			// probably spent when the allocator went away, and a full start
			// would add a burst of the whole capacity across the fleet.
			fresh := newKeyState(st.sh, st.key, share, now) // a bucket holder, never linked
			fresh.take(ration.Amount{Requests: capacityOf(share.RPM, share.BurstRequests), Tokens: capacityOf(share.TPM, share.BurstTokens)})
			st.req, st.tok = fresh.req, fresh.tok
			ls.fallback, ls.fbLim = true, share
		}
		fb := keyState{lim: share, req: st.req, tok: st.tok}
		fb.advance(now)
		w, dim, fits := fb.wait(c)
		if !fits {
			w = time.Second // above this spender's share: try again when the allocator is back
		}
		if w > 0 {
			rej := &RejectError{RetryAfter: w, Status: fb.status(), Dimension: dim, Cost: c}
			m.reject(rej)
			return nil, rej
		}
		fb.take(c)
		st.req, st.tok = fb.req, fb.tok
	}
	lc := limitedPart(st.lim, c)
	ls.debt = add(ls.debt, lc)
	ls.record(lc, now)
	m.admit(pathFallback)
	return ls.reservation(st.sh, st, c, now, pathFallback, 0), nil
}

// shareOf is lim divided among n spenders, at least 1 per limited dimension.
func shareOf(lim ration.Limits, n int64) ration.Limits {
	div := func(v int64) int64 {
		if v == 0 {
			return 0
		}
		return max(1, v/n)
	}
	return ration.Limits{RPM: div(lim.RPM), TPM: div(lim.TPM),
		BurstRequests: div(capacityOf(lim.RPM, lim.BurstRequests)), BurstTokens: div(capacityOf(lim.TPM, lim.BurstTokens))}
}

// reserveAhead is wait mode when the lease cannot cover c: the allocator
// reserves c for the earliest time its global buckets cover it.
func (l *Limiter) reserveAhead(ctx context.Context, st *keyState, lim ration.Limits, c ration.Amount, maxWait time.Duration) (Reservation, time.Time, error) {
	lz := l.lz
	job := &aheadJob{st: st, lim: lim, cost: c, maxWait: maxWait, res: make(chan aheadResult, 1)}
	lz.mu.Lock()
	if lz.closing {
		lz.mu.Unlock()
		return nil, time.Time{}, ErrClosed
	}
	lz.aheads = append(lz.aheads, job)
	lz.urgent = true
	lz.mu.Unlock()
	lz.poke()
	var res aheadResult
	t := time.NewTimer(lz.cfg.slowDeadline)
	defer t.Stop()
	select {
	case res = <-job.res:
	case <-t.C:
		res.err = errUnreachable
	case <-ctx.Done():
		return nil, time.Time{}, ctx.Err()
	}
	inst := l.now()
	now := l.timeOf(inst)
	sh := st.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ls := st.ls
	if res.err != nil {
		// Unreachable: wait mode falls back to now-or-never under the policy.
		r, err := l.fallbackLocked(st, c, inst)
		return r, now, err
	}
	kr := res.r
	ls.setSnapshot(kr.GetSnapshot(), inst)
	wait := time.Duration(kr.GetWaitUs()) * time.Microsecond
	switch kr.GetStatus() {
	case leasev1.GrantStatus_GRANT_STATUS_OK:
		lc := limitedPart(lim, c)
		ls.outstanding = add(ls.outstanding, lc)
		ls.record(lc, inst)
		lz.cfg.metrics.admit(pathAhead)
		return ls.reservation(sh, st, c, inst, pathAhead, 0), res.recv.Add(wait), nil
	case leasev1.GrantStatus_GRANT_STATUS_TOO_LARGE:
		dim, _ := oversize(lim, c)
		rej := &RejectError{Status: ls.status(lim, inst), Dimension: dim, Oversize: true, Cost: c}
		lz.cfg.metrics.reject(rej)
		return nil, time.Time{}, rej
	}
	rej := &RejectError{RetryAfter: wait, Status: ls.status(lim, inst), Dimension: Tokens, Cost: c}
	if lim.TPM == 0 {
		rej.Dimension = Requests
	}
	lz.cfg.metrics.reject(rej)
	return nil, time.Time{}, rej
}

// leasedReservation is a leased Limiter's Reservation.
type leasedReservation struct {
	sh   *shard // st.sh, kept here so that settling reads one cache line less
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
func (ls *leaseState) reservation(sh *shard, st *keyState, c ration.Amount, now bucket.Instant, path admitPath, gen uint32) *leasedReservation {
	r := &leasedReservation{sh: sh, st: st, kl: st.kl, cost: c, path: path, gen: gen}
	r.rem[0], r.rem[1] = ls.remaining(st.lim, now)
	return r
}

func (r *leasedReservation) Status() Status { return leasedStatus(r.kl.lim, r.rem[0], r.rem[1]) }

func (r *leasedReservation) Cancel() { r.settle(ration.Amount{}, true) }

func (r *leasedReservation) Settle(actual ration.Amount) { r.settle(actual, false) }

func (r *leasedReservation) settle(actual ration.Amount, cancel bool) {
	// Clamped so that absurd usage saturates instead of overflowing the
	// sums it is added to.
	actual.Requests, actual.Tokens = min(max(0, actual.Requests), maxWire), min(max(0, actual.Tokens), maxWire)
	st, sh := r.st, r.sh
	l := sh.l
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if r.done {
		return
	}
	r.done = true
	if !cancel {
		l.lz.cfg.metrics.usage(r.cost.Tokens, actual.Tokens)
	}
	ls := st.ls
	lim := st.lim
	switch r.path {
	case pathFallback:
		delta := sub(limitedPart(lim, actual), limitedPart(lim, r.cost))
		ls.debt = add(ls.debt, delta)
		ls.debt = ration.Amount{Requests: max(0, ls.debt.Requests), Tokens: max(0, ls.debt.Tokens)}
		if ls.fallback {
			now := l.now() // an overrun is charged after the refill
			fb := keyState{lim: ls.fbLim, req: st.req, tok: st.tok}
			refund := sub(r.cost, actual)
			fb.give(ration.Amount{Requests: max(0, refund.Requests), Tokens: max(0, refund.Tokens)})
			fb.advance(now)
			fb.take(ration.Amount{Requests: max(0, -refund.Requests), Tokens: max(0, -refund.Tokens)})
			st.req, st.tok = fb.req, fb.tok
		}
	case pathAhead:
		// The reservation was made at the allocator for a send time that
		// the local lease does not cover: a refund goes back to the
		// allocator on the next call, an overrun is debt.
		rc, ac := limitedPart(lim, r.cost), limitedPart(lim, actual)
		ls.outstanding = sub(ls.outstanding, rc)
		ls.outstanding = ration.Amount{Requests: max(0, ls.outstanding.Requests), Tokens: max(0, ls.outstanding.Tokens)}
		d := sub(rc, ac)
		ls.ret = add(ls.ret, ration.Amount{Requests: max(0, d.Requests), Tokens: max(0, d.Tokens)})
		ls.debt = add(ls.debt, ration.Amount{Requests: max(0, -d.Requests), Tokens: max(0, -d.Tokens)})
	default:
		ls.settle(lim, r.cost, actual, r.gen)
	}
}
