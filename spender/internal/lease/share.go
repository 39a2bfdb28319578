package lease

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

// renewEvery is how often a key holding a share is renewed: half a TTL.
func (e *Env) renewEvery() time.Duration { return e.TTL / 2 }

// idleAfter is how long a key goes without traffic before it counts as
// idle: as long as still lets its give-back, sent at a maintenance tick and
// answered within a lead, end within a TTL of its last request (at least
// half a TTL; 0 before any answer).
func (e *Env) idleAfter() time.Duration {
	return max(e.TTL/2, e.TTL-2*e.Tuning.MaintenanceInterval-e.Lead)
}

// fresh is how long the global state an answer reported says something:
// a renewal period plus the time a renewal takes.
func (e *Env) fresh() time.Duration {
	return e.renewEvery() + e.Tuning.MaintenanceInterval + e.Lead
}

// idle reports whether k has had no traffic for idleAfter and still holds
// a lease or a share, or the allocator counts it holding more than it does
// (requests unsettled at its last call have settled since): its next call
// gives everything back and asks for nothing, no share either, so that a
// TTL after a key's last request, whatever that request's answer, the
// gateway holds nothing of it, nor does the allocator count anything, and
// no more calls are made for it.
func (e *Env) idle(k *Key, now bucket.Instant) bool {
	idle := e.idleAfter()
	if idle <= 0 || now.Sub(k.lastAsked()) < idle {
		return false
	}
	holds := k.avail.Add(k.outstanding)
	return k.avail != (ration.Amount{}) || k.ss != nil && !(k.ss.share.Zero() && k.ss.fair.Zero()) ||
		k.counted.Requests > holds.Requests || k.counted.Tokens > holds.Tokens
}

// shareUsable reports whether k's share accrues into its lease now, on
// the key's current limits (a share granted on other limits is left to
// the allocator: the next call carries the new ones).
func (k *Key) shareUsable(now bucket.Instant) bool {
	return k.ss != nil && !k.ss.share.Zero() && k.ss.lim == k.lim && now < k.expiry
}

// globalShort reports whether the key's global buckets, as the allocator
// last reported them, cannot give n: some limited dimension's remaining
// is below n's. A report older than fresh (a renewal period plus the time
// a renewal takes) says nothing.
func (k *Key) globalShort(n ration.Amount, now bucket.Instant, fresh time.Duration) bool {
	if !k.hasSnap || now.Sub(k.snapAt) >= fresh {
		return false
	}
	// Room is the shortfall and, while the bucket holds less than a quarter
	// of its capacity, an even split among the key's active spenders worth
	// a call (eight of the last cost): at saturation the global bucket
	// holds only what returns brought back, and a fleet that asked for
	// every sliver of it would be back to a call per admission. A bucket
	// with more than that is not saturated: ask rather than refuse.
	worth := ration.Amount{Requests: 8 * k.cost.Requests, Tokens: 8 * k.cost.Tokens}
	active := int64(max(1, k.active))
	lim := k.lim
	capacity := lim.Capacity()
	short := func(rem, n, worth, capacity int64) bool {
		return n > 0 && (rem < n || rem < capacity/4 && rem/active < worth)
	}
	return lim.RPM > 0 && short(k.snapRem.Requests, n.Requests, worth.Requests, capacity.Requests) ||
		lim.TPM > 0 && short(k.snapRem.Tokens, n.Tokens, worth.Tokens, capacity.Tokens)
}

// refusal is the local refusal of c on k at now when the lease does not
// cover it, or nil when the allocator must be asked (or the fallback
// policy decide). The key refuses locally while a wait the allocator named
// for its global buckets runs (askAt: a renewal period at most, since
// shares may be split anew), or when its refill share will cover the
// shortfall within the lease and the global buckets had nothing for it in
// the last answer (less than the shortfall, or too little to be worth a
// call at saturation: globalShort). Its wait is toldWait's.
func (e *Env) refusal(k *Key, c ration.Amount, now bucket.Instant) *Refusal {
	lack := k.lim.Limited(c).Sub(k.avail).Positive()
	own, ownDim, ownOK := e.shareWait(k, lack, now)
	shareRefuses := ownOK && now.Add(own) < k.expiry && k.globalShort(lack, now, e.fresh())
	if k.askAt <= now && !shareRefuses {
		return nil
	}
	wait, dim := e.toldWait(k, lack, now, own, ownDim, ownOK)
	return k.rejection(c, dim, wait, now)
}

// toldWait is the wait a refusal of a request lacking lack tells the
// client (its Retry-After), with the dimension it waits on, given what the
// key's share takes (own, on ownDim, if ownOK: shareWait): the earliest
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
func (e *Env) toldWait(k *Key, lack ration.Amount, now bucket.Instant, own time.Duration, ownDim Dim, ownOK bool) (time.Duration, Dim) {
	lim := k.lim
	wait, dim := bucket.InfDuration, k.shortDim
	if k.askAt > now {
		wait = k.coveredAt.Sub(now)
	}
	if ownOK && own < wait {
		wait, dim = own, ownDim
	}
	renew := e.renewEvery()
	if ss := k.ss; ss != nil && (ss.fair.Requests > ss.share.Requests || ss.fair.Tokens > ss.share.Tokens) {
		if d, ok := ss.lim.AccrualTime(ss.fair, lack); ok && renew+d < wait {
			wait = renew + d
		}
	}
	if shared := k.snapShared; wait >= bucket.InfDuration/2 &&
		(lim.RPM > 0 && shared.Requests >= ration.ShareUnit || lim.TPM > 0 && shared.Tokens >= ration.ShareUnit) {
		d, _ := lim.AccrualTime(ration.Share{Requests: ration.ShareUnit, Tokens: ration.ShareUnit}, lack)
		wait = renew + d
	}
	return wait, dim
}

// shareWait is the time k's share takes to accrue lack, and the dimension
// that takes longest; ok is false when the share cannot cover it (none,
// one granted on other limits, paused by an outage, or lack above its
// burst). It does not stop at the lease's expiry: renewals carry the share
// on.
func (e *Env) shareWait(k *Key, lack ration.Amount, now bucket.Instant) (time.Duration, Dim, bool) {
	if !k.shareUsable(now) || k.ss.paused && e.Fallback {
		return 0, 0, false
	}
	ss := k.ss
	lc := lack.Add(k.avail)
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

// shareRefills reports whether k's share, not an allocator call, should
// refill a lease that an admission of c left below its low watermark:
// the share accrues and the global buckets, as last reported (fresh for
// as long as fresh), cannot bring the lease back above the watermark
// anyway.
func (k *Key) shareRefills(c ration.Amount, now bucket.Instant, fresh time.Duration) bool {
	if !k.shareUsable(now) || k.ss.paused {
		return false
	}
	return k.globalShort(k.lowWater.Add(k.lim.Limited(c)).Sub(k.avail).Positive(), now, fresh)
}

// renewDue reports whether k, holding a share, is due for renewal at now:
// a renewal period (half a TTL) after its last send, or an eighth of a TTL
// when its demand moved a lot against the share or the share is well below
// its fair share.
func (e *Env) renewDue(k *Key, now bucket.Instant) bool {
	ss, ttl := k.ss, e.TTL
	if ss == nil || ss.share.Zero() && ss.fair.Zero() || k.inCall || ttl <= 0 {
		return false
	}
	since := now.Sub(ss.sent)
	return since >= e.renewEvery() || since >= ttl/8 && (k.demandMoved(now) || ss.owed())
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
func (k *Key) demandMoved(now bucket.Instant) bool {
	ss, lim := k.ss, k.lim
	ss.trackDemand(k.spentTotal, k.cost, now)
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
		{lim.RPM > 0, ss.share.Requests, float64(asked.Requests), shareReq, float64(ss.sentDem.Requests), k.cost.Requests},
		{lim.TPM > 0, ss.share.Tokens, float64(asked.Tokens), shareTok, float64(ss.sentDem.Tokens), k.cost.Tokens},
	}
	if !ss.share.Zero() && ss.silent(now.Sub(k.lastAsked()), k.cost) {
		return true // it stopped: give the share back now
	}
	low, seen := true, false
	for _, d := range dims {
		if !d.limited {
			continue
		}
		if ref := max(d.share, d.was); ss.refused != (ration.Amount{}) && d.asked > 1.25*ref && risenBeyondNoise(d.asked, ref, d.cost, ss.tau(k.cost)) {
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

// returnExcess gives back, on the call being built, the part of a key's
// lease its demand does not need over horizon (plus one request of the
// last cost), when it holds a share: the share refills the lease, and a
// gateway whose traffic moved elsewhere would otherwise sit on what it
// was granted and accrued while it was busy.
func (k *Key) returnExcess(horizon time.Duration, now bucket.Instant) {
	ss := k.ss
	if ss == nil || ss.share.Zero() || now >= k.expiry {
		return
	}
	ss.trackDemand(k.spentTotal, k.cost, now)
	h := horizon.Seconds()
	keep := ration.Amount{Requests: int64(ss.demReq*h) + k.cost.Requests, Tokens: int64(ss.demTok*h) + k.cost.Tokens}
	excess := k.lim.Limited(k.avail.Sub(keep).Positive())
	k.avail = k.avail.Sub(excess)
	k.ret = k.ret.Add(excess)
}
