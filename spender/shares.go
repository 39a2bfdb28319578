package spender

import (
	"math"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// Refill shares: the rules a leased Limiter follows for a key whose
// allocator answers carry a share of the key's refill rate (see
// docs/leasing.md, "Rate shares"). A key without a share takes none of
// these paths.

// leaseTTL is the lease TTL the allocator last answered with (0 before
// any answer).
func (lz *leaser) leaseTTL() time.Duration { return time.Duration(lz.ttl.Load()) }

// renewEvery is how often a key holding a share is renewed: half a TTL.
func (lz *leaser) renewEvery() time.Duration { return lz.leaseTTL() / 2 }

// idleAfter is how long a key goes without traffic before it counts as
// idle: as long as still lets its give-back, sent at a maintenance tick and
// answered within a lead, end within a TTL of its last request (at least
// half a TTL; 0 before any answer).
func (lz *leaser) idleAfter() time.Duration {
	ttl := lz.leaseTTL()
	return max(ttl/2, ttl-2*lz.cfg.tuning.MaintenanceInterval-lz.lead())
}

// idleLocked reports whether ls's key has had no traffic for idleAfter and
// still holds a lease or a share, or the allocator counts it holding more
// than it does (requests unsettled at its last call have settled since)
// (the shard locked): its next call gives everything back and asks for
// nothing, no share either, so that a TTL after a key's last request,
// whatever that request's answer, the gateway holds nothing of it, nor
// does the allocator count anything, and no more calls are made for it.
func (lz *leaser) idleLocked(ls *leaseState, now bucket.Instant) bool {
	idle := lz.idleAfter()
	if idle <= 0 || now.Sub(ls.lastAsked()) < idle {
		return false
	}
	holds := ls.avail.Add(ls.outstanding)
	return ls.avail != (ration.Amount{}) || ls.ss != nil && !(ls.ss.share.Zero() && ls.ss.fair.Zero()) ||
		ls.counted.Requests > holds.Requests || ls.counted.Tokens > holds.Tokens
}

// accrueLocked credits st's share accrued up to now (the shard locked)
// and counts it.
func (lz *leaser) accrueLocked(st *keyState, now bucket.Instant) {
	if st.ls.ss == nil {
		return
	}
	if add := st.ls.accrue(st.lim, now); add != (ration.Amount{}) {
		lz.cfg.metrics.shareAccrued(add)
	}
}

// shareUsable reports whether st's share accrues into its lease now, on
// the key's current limits (a share granted on other limits is left to
// the allocator: the next call carries the new ones).
func shareUsable(st *keyState, now bucket.Instant) bool {
	ls := st.ls
	return ls.ss != nil && !ls.ss.share.Zero() && ls.ss.lim == st.lim && now < ls.expiry
}

// globalShort reports whether the key's global buckets, as the allocator
// last reported them, cannot give n: some limited dimension's remaining
// is below n's. A report older than a renewal period (plus the time a
// renewal takes) says nothing.
func (lz *leaser) globalShort(ls *leaseState, lim ration.Limits, n ration.Amount, now bucket.Instant) bool {
	fresh := lz.renewEvery() + lz.cfg.tuning.MaintenanceInterval + lz.lead()
	if !ls.hasSnap || now.Sub(ls.snapAt) >= fresh {
		return false
	}
	// Room is the shortfall and, while the bucket holds less than a quarter
	// of its capacity, an even split among the key's active spenders worth
	// a call (eight of the last cost): at saturation the global bucket
	// holds only what returns brought back, and a fleet that asked for
	// every sliver of it would be back to a call per admission. A bucket
	// with more than that is not saturated: ask rather than refuse.
	worth := ration.Amount{Requests: 8 * ls.ss.cost.Requests, Tokens: 8 * ls.ss.cost.Tokens}
	active := int64(max(1, ls.active))
	capacity := lim.Capacity()
	short := func(rem, n, worth, capacity int64) bool {
		return n > 0 && (rem < n || rem < capacity/4 && rem/active < worth)
	}
	return lim.RPM > 0 && short(ls.snapRem.Requests, n.Requests, worth.Requests, capacity.Requests) ||
		lim.TPM > 0 && short(ls.snapRem.Tokens, n.Tokens, worth.Tokens, capacity.Tokens)
}

// refusalLocked is the local refusal of c on st at now when the lease does
// not cover it (the shard locked), or nil when the allocator must be asked
// (or the fallback policy decide). The key refuses locally while a wait the
// allocator named for its global buckets runs (askAt: a renewal period at
// most, since shares may be split anew), or when its refill share will
// cover the shortfall within the lease and the global buckets had nothing
// for it in the last answer (less than the shortfall, or too little to be
// worth a call at saturation: globalShort). RetryAfter is toldWaitLocked's.
func (lz *leaser) refusalLocked(st *keyState, c ration.Amount, now bucket.Instant) *RejectError {
	ls, lim := st.ls, st.lim
	lack := lim.Limited(c).Sub(ls.avail).Positive()
	own, ownDim, ownOK := lz.shareWaitLocked(st, lack, now)
	shareRefuses := ownOK && now.Add(own) < ls.expiry && lz.globalShort(ls, lim, lack, now)
	if ls.askAt <= now && !shareRefuses {
		return nil
	}
	wait, dim := lz.toldWaitLocked(st, lack, now, own, ownDim, ownOK)
	return ls.rejection(lim, c, dim, wait, now)
}

// toldWaitLocked is the wait a refusal of a request lacking lack tells the
// client (its Retry-After), with the dimension it waits on, given what the
// key's share takes (own, on ownDim, if ownOK: shareWaitLocked): the earliest
// instant the key can admit it on what this spender knows, assuming the
// shares stay as the last answer split them. That is the sooner of
//
//   - the allocator's exact wait for the key's global buckets, at the
//     refill the shares leave them (after a NOT_COVERED answer, while the
//     key does not ask again);
//   - the time this spender's refill share takes to accrue lack (its
//     renewals carry the share past the lease);
//   - while the share is below the fair share the allocator named (others
//     still hold the rest and give it back as they renew), a renewal
//     period plus the time the fair share takes.
//
// When none of these is known because the shares take the whole refill
// (and this spender has none), it is a renewal period plus the time the
// key's whole rate takes to refill lack: by then the shares are split anew
// with this spender's demand in, and no split refills it sooner. (A wait
// beyond reach for another reason, a debt of 2^50 tokens, stays what it
// is.) docs/contract.md says how late or early these can be.
func (lz *leaser) toldWaitLocked(st *keyState, lack ration.Amount, now bucket.Instant, own time.Duration, ownDim Dimension, ownOK bool) (time.Duration, Dimension) {
	ls, lim := st.ls, st.lim
	wait, dim := bucket.InfDuration, ls.shortDim
	if ls.askAt > now {
		wait = ls.coveredAt.Sub(now)
	}
	if ownOK && own < wait {
		wait, dim = own, ownDim
	}
	renew := lz.renewEvery()
	if ss := ls.ss; ss != nil && (ss.fair.Requests > ss.share.Requests || ss.fair.Tokens > ss.share.Tokens) {
		if d, ok := ss.lim.AccrualTime(ss.fair, lack); ok && renew+d < wait {
			wait = renew + d
		}
	}
	if shared := ls.snapShared; wait >= bucket.InfDuration/2 &&
		(lim.RPM > 0 && shared.Requests >= ration.ShareUnit || lim.TPM > 0 && shared.Tokens >= ration.ShareUnit) {
		d, _ := lim.AccrualTime(ration.Share{Requests: ration.ShareUnit, Tokens: ration.ShareUnit}, lack)
		wait = renew + d
	}
	return wait, dim
}

// shareWaitLocked is the time st's share takes to accrue lack, and the
// dimension that takes longest; ok is false when the share cannot cover it
// (none, one granted on other limits, paused by an outage, or lack above
// its burst). It does not stop at the lease's expiry: renewals carry the
// share on.
func (lz *leaser) shareWaitLocked(st *keyState, lack ration.Amount, now bucket.Instant) (time.Duration, Dimension, bool) {
	ls := st.ls
	if !shareUsable(st, now) || ls.ss.paused && lz.fallback.Load() {
		return 0, 0, false
	}
	ss := ls.ss
	lc := lack.Add(ls.avail)
	if lack.Requests > 0 && lc.Requests > ss.burst.Requests || lack.Tokens > 0 && lc.Tokens > ss.burst.Tokens {
		return 0, 0, false // accrual stops at the burst before it covers the cost
	}
	d, ok := ss.lim.AccrualTime(ss.share, lack)
	if !ok {
		return 0, 0, false
	}
	dim := Tokens
	if dr, _ := ss.lim.AccrualTime(ss.share, ration.Amount{Requests: lack.Requests}); dr == d && lack.Requests > 0 {
		dim = Requests
	}
	return d, dim, true
}

// shareRefills reports whether st's share, not an allocator call, should
// refill a lease that an admission of c left below its low watermark:
// the share accrues and the global buckets, as last reported, cannot
// bring the lease back above the watermark anyway.
func (lz *leaser) shareRefills(st *keyState, c ration.Amount, now bucket.Instant) bool {
	ls := st.ls
	if !shareUsable(st, now) || ls.ss.paused {
		return false
	}
	return lz.globalShort(ls, st.lim, ls.lowWater.Add(st.lim.Limited(c)).Sub(ls.avail).Positive(), now)
}

// renewDue reports whether st, holding a share, is due for renewal at
// now: a renewal period (half a TTL) after its last send, or an eighth of
// a TTL when its demand moved a lot against the share or the share is well
// below its fair share (the shard locked).
func (lz *leaser) renewDue(st *keyState, now bucket.Instant) bool {
	ls, ttl := st.ls, lz.leaseTTL()
	ss := ls.ss
	if ss == nil || ss.share.Zero() && ss.fair.Zero() || ls.inCall || ttl <= 0 {
		return false
	}
	since := now.Sub(ss.sent)
	return since >= lz.renewEvery() || since >= ttl/8 && (ls.demandMoved(st.lim, now) || ss.owed())
}

// owed reports whether the share is well below the fair share the
// allocator named (by more than a tenth of it in some dimension): others
// still hold the rest and give it back as they renew, so renewing sooner
// gets it sooner.
func (ss *shareState) owed() bool {
	return uint64(ss.share.Requests)*10 < uint64(ss.fair.Requests)*9 || uint64(ss.share.Tokens)*10 < uint64(ss.fair.Tokens)*9
}

// demandMoved reports whether what the key's traffic asks (admitted and
// refused, per minute, the demand estimate) moved a lot against its
// share: above 1.25 times both the share's rate and the demand last sent,
// and above the larger of the two by more than the estimate's noise at
// that rate (risenBeyondNoise), with refusals since; or, in every
// dimension with a share, below half of the smaller of the two, or silent.
// Low rates are noisy: a dimension counts as low only once the time since
// the last send would have seen eight requests of the last cost at that
// rate.
func (ls *leaseState) demandMoved(lim ration.Limits, now bucket.Instant) bool {
	ss := ls.ss
	ss.trackDemand(ls.spentTotal, now)
	dt := now.Sub(ss.sent).Minutes()
	if dt <= 0 {
		return false
	}
	asked := ration.Amount{Requests: int64(ss.demReq * 60), Tokens: int64(ss.demTok * 60)} // per minute
	shareReq, shareTok := ss.perMinute()
	dims := [2]struct {
		limited           bool
		ppm               uint32
		asked, share, was float64 // per minute
		cost              int64
	}{
		{lim.RPM > 0, ss.share.Requests, float64(asked.Requests), shareReq, float64(ss.sentDem.Requests), ss.cost.Requests},
		{lim.TPM > 0, ss.share.Tokens, float64(asked.Tokens), shareTok, float64(ss.sentDem.Tokens), ss.cost.Tokens},
	}
	if !ss.share.Zero() && ss.silent(now.Sub(ls.lastAsked())) {
		return true // it stopped: give the share back now
	}
	low, seen := true, false
	for _, d := range dims {
		if !d.limited {
			continue
		}
		if ref := max(d.share, d.was); ss.refused != (ration.Amount{}) && d.asked > 1.25*ref && risenBeyondNoise(d.asked, ref, d.cost, ss.tau()) {
			return true
		}
		if d.ppm == 0 {
			continue
		}
		ref := min(d.share, d.was)
		if ref*dt < 8*float64(max(1, d.cost)) {
			low = false
			continue
		}
		seen = true
		low = low && d.asked < 0.5*ref
	}
	return seen && low
}

// risenBeyondNoise reports whether a demand estimate (per minute) is above
// ref (per minute) by more than three standard deviations of the estimate
// for a stream at ref of requests costing cost each. The estimate weighs
// each request by e^(-age/tau)/tau, so for Poisson arrivals its variance is
// ref·cost/(2·tau) per second squared: a gateway that sees a request every
// few seconds has an estimate that jumps well past 1.25 times its rate
// with each one, and renewing on those jumps cost 64 gateways at 2× the
// limit a fifth more allocator calls per admission.
func risenBeyondNoise(asked, ref float64, cost int64, tau time.Duration) bool {
	perSec := ref / 60
	sd := math.Sqrt(perSec * float64(max(1, cost)) / (2 * tau.Seconds()))
	return asked/60-perSec > 3*sd
}

// perMinute is the share's rate per minute, per dimension.
func (ss *shareState) perMinute() (req, tok float64) {
	f := float64(time.Minute) / float64(ss.lim.Period()) / ration.ShareUnit
	return float64(ss.lim.RPM) * float64(ss.share.Requests) * f, float64(ss.lim.TPM) * float64(ss.share.Tokens) * f
}

// returnExcessLocked gives back, on the call being built, the part of a
// key's lease its demand does not need over horizon (plus one request of
// the last cost), when it holds a share: the share refills the lease, and
// a gateway whose traffic moved elsewhere would otherwise sit on what it
// was granted and accrued while it was busy.
func (ls *leaseState) returnExcessLocked(lim ration.Limits, horizon time.Duration, now bucket.Instant) {
	ss := ls.ss
	if ss == nil || ss.share.Zero() || now >= ls.expiry {
		return
	}
	ss.trackDemand(ls.spentTotal, now)
	h := horizon.Seconds()
	keep := ration.Amount{Requests: int64(ss.demReq*h) + ss.cost.Requests, Tokens: int64(ss.demTok*h) + ss.cost.Tokens}
	excess := lim.Limited(ls.avail.Sub(keep).Positive())
	ls.avail = ls.avail.Sub(excess)
	ls.ret = ls.ret.Add(excess)
}
