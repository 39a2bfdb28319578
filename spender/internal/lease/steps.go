package lease

import (
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// The steps a key goes through, each with the key's owner's lock held.

// Judge applies the leased path's per-key rules to c at now, changing no
// budget but crediting the key's share accrued so far (returned, for
// counting): an error for a key the allocator rejected; a refusal for a
// cost that can never fit, or that the key refuses on its own (refusal);
// covered when the lease covers it. Otherwise (all zero) the allocator
// must be asked, or the fallback policy decide.
func (e *Env) Judge(k *Key, c ration.Amount, now bucket.Instant) (covered bool, ref *Refusal, accrued ration.Amount, err error) {
	if k.rejected != nil {
		return false, nil, ration.Amount{}, k.rejected
	}
	if dim, big := k.oversize(c); big {
		return false, k.rejection(c, dim, 0, now), ration.Amount{}, nil
	}
	accrued = k.accrue(now)
	if k.valid(now) && k.covers(c) {
		return true, nil, accrued, nil
	}
	return false, e.refusal(k, c, now), accrued, nil
}

// Admit admits c from k's lease if it is valid and covers c, and reports
// whether the key should be queued for a refresh: the lease fell below
// its low watermark and no call or share will refill it.
func (e *Env) Admit(k *Key, c ration.Amount, now bucket.Instant) (ok, refresh bool) {
	if !k.valid(now) || !k.covers(c) {
		return false, false
	}
	return true, e.spend(k, c, now)
}

// TryAdmit is Judge and Admit at once for the common case: c admitted from
// k's lease, which (with the share's accrual to now, credited and returned
// either way) is valid and covers it, on a key the allocator did not
// reject, for a cost that fits. Otherwise it admits nothing (ok false) and
// Judge decides; a second look at the same instant accrues nothing more.
func (e *Env) TryAdmit(k *Key, c ration.Amount, now bucket.Instant) (ok, refresh bool, accrued ration.Amount) {
	if k.rejected != nil {
		return false, false, ration.Amount{}
	}
	if _, big := k.oversize(c); big {
		return false, false, ration.Amount{}
	}
	accrued = k.accrue(now)
	if !k.valid(now) || !k.covers(c) {
		return false, false, accrued
	}
	return true, e.spend(k, c, now), accrued
}

// spend takes c from k's lease and reports whether the key should be
// queued for a refresh (see Admit).
func (e *Env) spend(k *Key, c ration.Amount, now bucket.Instant) (refresh bool) {
	k.spend(c, now)
	return !k.queued && !k.inCall && k.low(c) && (k.ss == nil || !k.shareRefills(c, now, e.fresh()))
}

// Ask records that a Reserve of c waits for the next Acquire carrying k.
func (k *Key) Ask(c ration.Amount) {
	lc := k.lim.Limited(c)
	k.waitMax = k.waitMax.Max(lc)
	k.waitSum = k.waitSum.Add(lc)
}

// Refuse counts c, refused at now, as demand the key did not meet.
func (k *Key) Refuse(c ration.Amount, now bucket.Instant) { k.refuse(c, now) }

// Queued reports whether k waits for the next Acquire; InCall whether it
// is in the Acquire being sent.
func (k *Key) Queued() bool { return k.queued }
func (k *Key) InCall() bool { return k.inCall }

// SetQueued and SetInCall change those.
func (k *Key) SetQueued(b bool) { k.queued = b }
func (k *Key) SetInCall(b bool) { k.inCall = b }

// Reject records the allocator's refusal of k's entry as invalid.
func (k *Key) Reject(err error) { k.rejected = err }

// FallbackCheck is the fallback policy's answer for c now, nil to admit:
// FailClosed refuses, FailOpen admits, FallbackShare admits what this
// spender's part of the key's limits covers (FallbackShareOf), from
// buckets that go on where the allocator left off (fallbackStart, from
// fallbackFrom). maxActive is the most active spenders any key reported,
// for a key that never had an answer.
func (e *Env) FallbackCheck(k *Key, c ration.Amount, now bucket.Instant, policy Policy, maxActive uint32) *Refusal {
	switch policy {
	case FailClosed:
		r := k.rejection(c, Requests, time.Second, now)
		r.Closed = true
		return r
	case FailOpen:
		return nil
	}
	n := k.active
	if n == 0 {
		n = max(1, maxActive)
	}
	var own ration.Share
	if k.ss != nil {
		own = k.ss.share
	}
	share := FallbackShareOf(k.lim, own, k.snapShared, int64(n))
	if !k.fbOn || k.fb.Lim != share {
		// Full at the instant the key stopped getting refill from the
		// allocator, then down to its part of what the global buckets held.
		if k.fb == nil {
			k.fb = new(Buckets)
		}
		*k.fb = NewBuckets(share, k.fallbackFrom(now))
		k.fb.Take(share.Capacity().Sub(fallbackStart(k.lim, share, k.snapRem)))
		k.fbOn = true
	}
	k.fb.Advance(now)
	w, dim, fits := k.fb.Wait(c)
	if !fits {
		w = time.Second // above this spender's share: try again when the allocator is back
	}
	if w > 0 {
		return k.rejection(c, dim, w, now)
	}
	return nil
}

// FallbackAdmit admits c under the fallback policy, after FallbackCheck
// said so: recorded as debt, reported when the allocator answers again.
func (k *Key) FallbackAdmit(c ration.Amount, now bucket.Instant, policy Policy) {
	if policy == FallbackShare {
		k.fb.Take(c)
	}
	lc := k.lim.Limited(c)
	k.debt = k.debt.Add(lc)
	k.record(lc, now)
}

// Aheaded applies the allocator's reservation ahead r of c, asked on
// limits lim and received at recv, at now: admitted (at recv plus its
// wait), or the refusal.
func (k *Key) Aheaded(r *Reserved, c ration.Amount, recv, now bucket.Instant) (at bucket.Instant, ref *Refusal) {
	k.setSnapshot(r.Snapshot, now)
	switch r.Status {
	case GrantOK:
		lc := k.lim.Limited(c)
		k.outstanding = k.outstanding.Add(lc)
		k.record(lc, now)
		return recv.Add(r.Wait), nil
	case GrantTooLarge:
		return 0, k.rejection(c, 0, 0, now)
	}
	dim := Tokens
	if k.lim.TPM == 0 {
		dim = Requests
	}
	return 0, k.rejection(c, dim, r.Wait, now)
}

// GiveBack adds a to what k gives back on its next call.
func (k *Key) GiveBack(a ration.Amount) { k.ret = k.ret.Add(a) }

// Entry takes k's reports and needs into a call first sent at now: what
// goes in (returns, debts) leaves the key, delivered exactly once, with
// the answer. The share accrues up to the send and then pauses until the
// answer: held is then the most this spender may hold. It returns the
// share accrued.
func (e *Env) Entry(k *Key, now bucket.Instant) (Entry, ration.Amount) {
	accrued := k.accrue(now)
	k.pauseShare(now)
	k.valid(now)
	k.updateRate(now)
	want := k.need()
	if e.idle(k, now) {
		k.ret = k.ret.Add(k.avail) // everything back, nothing asked
		k.avail = ration.Amount{}
	} else {
		k.returnExcess(e.Tuning.Horizon, now)
		want = k.want(e.Tuning.Horizon)
	}
	held := k.avail.Add(k.outstanding).Positive()
	en := Entry{
		Key: k.id, Limits: k.lim,
		Want:      want.Clamp(),
		Need:      k.need().Clamp(),
		SpendRate: ration.Amount{Requests: int64(k.rateReq * 60), Tokens: int64(k.rateTok * 60)}.Clamp(),
		Returned:  k.ret.Clamp(),
		Held:      held.Clamp(),
		Debt:      k.debt.Clamp(),
		Demand:    k.demand(now, e.idleAfter()).Clamp(),
	}
	k.ret, k.debt, k.waitMax, k.waitSum = ration.Amount{}, ration.Amount{}, ration.Amount{}, ration.Amount{}
	k.queued, k.inCall = false, true
	return en, accrued
}

// Apply applies the answer g to k's entry en of the call first sent at
// sent, whose lease runs to expiry, received at recv.
func (e *Env) Apply(k *Key, en *Entry, g *Grant, sent, expiry, recv bucket.Instant) {
	need := en.Need
	k.expiry = expiry
	k.fbOn = false // an answer ends the outage for the key: the next one falls back from it
	if recv >= expiry {
		k.avail = ration.Amount{} // the answer came too late to spend anything
	}
	switch g.Status {
	case GrantOK:
		if recv < expiry {
			k.avail = k.avail.Add(k.lim.Limited(g.Granted))
		}
		k.coveredAt, k.askAt = 0, 0
	case GrantNotCovered:
		// The wait is exact at the refill the shares leave the global
		// buckets; shares may be split anew at the next renewals, so the
		// key asks again after a renewal period at most.
		w := g.RetryAfter
		k.coveredAt, k.askAt = recv.Add(w), recv.Add(w)
		if r := e.renewEvery(); r > 0 && r < w {
			k.askAt = recv.Add(r)
		}
		k.shortDim = shortDim(k.lim, need, g.Snapshot)
	case GrantTooLarge:
		// The need can never fit the limits the call carried. A request
		// that cannot fit its own limits is refused before it asks, so
		// this answer is about other limits: a call built while the key's
		// limits changed (requests in flight still carry the old ones).
		// The waiters ask again, with their own.
	}
	if g.HasHeld {
		k.trimTo(g.Held)
	}
	k.counted = k.lim.Limited(g.Held)
	// The share replaces the last one (none: zero) and accrues from
	// receipt, on the limits the call carried: the allocator's.
	k.setShare(g.Share, g.Burst, g.Fair, g.HasFair, en.Limits, en.Demand, sent, recv)
	k.setSnapshot(g.Snapshot, recv)
	if g.Active > 0 {
		k.active = g.Active
	}
	k.setLowWater(e.Lead)
}

// shortDim is the dimension whose global bucket falls short of need,
// tokens when both or neither do.
func shortDim(lim ration.Limits, need ration.Amount, sn *Snapshot) Dim {
	var rem ration.Amount
	if sn != nil {
		rem = sn.Remaining
	}
	if lim.RPM > 0 && need.Requests > rem.Requests && (lim.TPM == 0 || need.Tokens <= rem.Tokens) {
		return Requests
	}
	return Tokens
}

// Scan is k's maintenance at now: it credits the share's accrual
// (returned), reports whether the key holds anything and the share's rate
// per minute (for the gauges), and whether the key should be queued: with
// force, anything to report; a share due for renewal; an idle key; a count
// at the allocator above what it holds; a lease about to expire (by soon),
// given back if the key is not in use, renewed if it is; debts and
// returns waiting on an idle key or an outage.
func (e *Env) Scan(k *Key, now, soon bucket.Instant, force bool) (held bool, shareRate [2]float64, accrued ration.Amount, send bool) {
	accrued = k.accrue(now)
	if ss := k.ss; ss != nil && !ss.share.Zero() && now < k.expiry {
		shareRate[0], shareRate[1] = ss.perMinute()
	}
	k.valid(now)
	held = k.holds(now)
	if k.queued {
		return held, shareRate, accrued, false
	}
	send = force && (k.debt != ration.Amount{} || k.ret != ration.Amount{} || k.avail != ration.Amount{})
	send = send || e.renewDue(k, now) || e.idle(k, now) || k.overCounted()
	if k.avail != (ration.Amount{}) && k.expiry <= soon {
		if now.Sub(k.lastAsked()) > e.Tuning.Horizon {
			k.ret = k.ret.Add(k.avail) // not in use: give it back before it is lost
			k.avail = ration.Amount{}
		}
		send = true
	}
	if k.debt != (ration.Amount{}) || k.ret != (ration.Amount{}) {
		send = send || now.Sub(k.lastUse) > e.Tuning.MaintenanceInterval || e.Fallback
	}
	return held, shareRate, accrued, send
}

// Release takes everything k gives back at Close into its entry (ok false
// when there is nothing to give back or report), crediting the share's
// accrual (returned) and ending the share: released, the holding is gone
// at the allocator.
func (k *Key) Release(now bucket.Instant) (en ReleaseEntry, accrued ration.Amount, ok bool) {
	accrued = k.accrue(now)
	k.endShare()
	k.valid(now)
	ret := k.ret.Add(k.avail)
	if ret == (ration.Amount{}) && k.debt == (ration.Amount{}) {
		return ReleaseEntry{}, accrued, false
	}
	en = ReleaseEntry{Key: k.id, Limits: k.lim, Returned: ret.Clamp(), Debt: k.debt.Clamp()}
	k.avail, k.ret, k.debt = ration.Amount{}, ration.Amount{}, ration.Amount{}
	return en, accrued, true
}
