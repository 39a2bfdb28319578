package spender

import (
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

// leaseState is one key's share of its global budget in a leased Limiter.
// It is guarded by the key's shard mutex. Only limited dimensions are
// tracked; an unlimited one is never short.
type leaseState struct {
	expiry      bucket.Instant // when avail stops being spendable
	avail       ration.Amount  // granted and unspent; spendable while now < expiry
	outstanding ration.Amount  // admitted and not yet settled (counted as held)
	lowWater    ration.Amount  // refresh when the lease falls below this plus a request
	spentTotal  ration.Amount  // spent since the state was made, net of refunds
	lastUse     bucket.Instant
	gen         uint32 // moves on each time the lease is seen to expire
	queued      bool   // waiting for the next Acquire
	inCall      bool   // in the Acquire being sent

	// The key's global state as of the last answer, for headers: whole
	// units left in the global buckets.
	snapRem ration.Amount
	snapAt  bucket.Instant
	hasSnap bool

	debt ration.Amount // spent beyond any grant, not yet reported
	ret  ration.Amount // to give back on the next call

	// lastCost is a request's cost recorded before the spend rate is
	// known, to size the first asks (want).
	lastCost ration.Amount

	notBefore bucket.Instant // after NOT_COVERED: answer locally until then
	shortDim  Dimension      // the dimension that was short then
	rejected  error          // the allocator refused the key's entry as invalid (ErrKeyRejected)

	waitMax ration.Amount // the largest cost a waiting Reserve needs
	waitSum ration.Amount // the sum of the costs waiting Reserves need
	wait    chan struct{} // closed when the next Acquire carrying this key ends

	active uint32 // spenders holding a lease on the key, per the allocator

	// Spend rate, estimated at each call from spentTotal.
	rated            bool // rateAt and rateBase are set
	rateAt           bucket.Instant
	rateBase         ration.Amount
	rateReq, rateTok float64 // per second

	fallback bool          // fallback buckets (keyState.req/tok) are at fbLim
	fbLim    ration.Limits // the share the fallback buckets were made for
}

// valid reports whether the lease may be spent at now, dropping it if not:
// budget from an expired lease is never spent (invariant 1). Dropping a
// lease moves the generation on, so that reservations made from it know.
func (ls *leaseState) valid(now bucket.Instant) bool {
	if now < ls.expiry {
		return true
	}
	if ls.avail != (ration.Amount{}) || ls.gen == 0 {
		ls.avail = ration.Amount{}
		ls.gen++
	}
	return false
}

// covers reports whether the lease covers c in every limited dimension.
func (ls *leaseState) covers(lim ration.Limits, c ration.Amount) bool {
	return (lim.RPM == 0 || ls.avail.Requests >= c.Requests) && (lim.TPM == 0 || ls.avail.Tokens >= c.Tokens)
}

// spend moves c from the lease to outstanding and records it.
func (ls *leaseState) spend(lim ration.Limits, c ration.Amount, now bucket.Instant) {
	c = lim.Limited(c)
	ls.avail = ls.avail.Sub(c)
	ls.outstanding = ls.outstanding.Add(c)
	ls.record(c, now)
}

// record counts c as spent now, for the rate estimate and the headers.
func (ls *leaseState) record(c ration.Amount, now bucket.Instant) {
	ls.spentTotal = ls.spentTotal.Add(c)
	if !ls.rated {
		ls.lastCost = c
	}
	ls.lastUse = now
}

// settle applies a reservation's actual usage: a refund goes back into a
// valid lease (or is lost with an expired one: returns cannot mint), an
// overrun is taken from the lease and the rest becomes debt.
//
// It needs no clock. A lease that expired since the reservation was made
// has been seen to expire (its generation moved on) or has not been looked
// at since: then a refund added to it is dropped at the next look, before
// anyone can spend it, and an overrun taken from it consumes budget that
// was granted and never returned.
func (ls *leaseState) settle(lim ration.Limits, reserved, actual ration.Amount, gen uint32) {
	reserved, actual = lim.Limited(reserved), lim.Limited(actual)
	ls.outstanding = ls.outstanding.Sub(reserved)
	ls.outstanding = ration.Amount{Requests: max(0, ls.outstanding.Requests), Tokens: max(0, ls.outstanding.Tokens)}
	ls.spentTotal = ls.spentTotal.Add(actual.Sub(reserved))
	valid := gen == ls.gen
	// adjust returns what the lease cannot cover of an overrun: the debt.
	adjust := func(avail *int64, r, a int64) (debt int64) {
		switch {
		case r > a && valid:
			*avail += r - a
		case a > r:
			over := a - r
			if valid {
				take := min(over, max(0, *avail))
				*avail -= take
				over -= take
			}
			return over
		}
		return 0
	}
	dr := adjust(&ls.avail.Requests, reserved.Requests, actual.Requests)
	dt := adjust(&ls.avail.Tokens, reserved.Tokens, actual.Tokens)
	if dr != 0 || dt != 0 { // only then touch the cold part
		ls.debt = ls.debt.Add(ration.Amount{Requests: dr, Tokens: dt})
	}
}

// setSnapshot records the global state an answer reported at now.
func (ls *leaseState) setSnapshot(sn *leasev1.Snapshot, now bucket.Instant) {
	if sn == nil {
		return
	}
	ls.snapRem = ration.Amount{Requests: sn.GetRequests().GetRemaining(), Tokens: sn.GetTokens().GetRemaining()}
	ls.snapAt, ls.hasSnap = now, true
}

// trimTo makes the lease agree with what the allocator says this spender
// holds: the allocator's word is authoritative (after it lost state it
// could not vouch for, it counts old holdings as zero), so an unspent
// lease above it is dropped. Unsettled requests stay admitted.
func (ls *leaseState) trimTo(lim ration.Limits, held ration.Amount) {
	local := ls.avail.Add(ls.outstanding)
	if lim.RPM > 0 && local.Requests > held.Requests {
		ls.avail.Requests = max(0, ls.avail.Requests-(local.Requests-held.Requests))
	}
	if lim.TPM > 0 && local.Tokens > held.Tokens {
		ls.avail.Tokens = max(0, ls.avail.Tokens-(local.Tokens-held.Tokens))
	}
}

// updateRate refreshes the spend-rate estimate at now (an exponentially
// weighted average of the rate between calls).
func (ls *leaseState) updateRate(now bucket.Instant) {
	if !ls.rated {
		ls.rated, ls.rateAt, ls.rateBase = true, now, ls.spentTotal
		return
	}
	dt := now.Sub(ls.rateAt).Seconds()
	if dt < 0.05 {
		return
	}
	// Net spend in the interval: refunds of requests admitted before it can
	// make it negative, which means "spent nothing".
	d := ls.spentTotal.Sub(ls.rateBase)
	r, t := max(0, float64(d.Requests)/dt), max(0, float64(d.Tokens)/dt)
	if ls.rateReq == 0 && ls.rateTok == 0 {
		ls.rateReq, ls.rateTok = r, t
	} else {
		ls.rateReq, ls.rateTok = 0.5*ls.rateReq+0.5*r, 0.5*ls.rateTok+0.5*t
	}
	ls.rateAt, ls.rateBase = now, ls.spentTotal
}

// need is the least grant worth having for the blocked Reserves: the
// largest one's shortfall against the lease as it is now (so the wait the
// allocator names is the exact global one).
func (ls *leaseState) need(lim ration.Limits) ration.Amount {
	return lim.Limited(ration.Amount{Requests: max(0, ls.waitMax.Requests-ls.avail.Requests), Tokens: max(0, ls.waitMax.Tokens-ls.avail.Tokens)})
}

// want is what to ask for on top of the lease: spend rate × horizon plus
// what the blocked Reserves wait for (a few requests' worth, at most an
// eighth of the capacity, while the rate is unknown), at least the need.
func (ls *leaseState) want(lim ration.Limits, horizon time.Duration) ration.Amount {
	h := horizon.Seconds()
	target := ration.Amount{Requests: int64(ls.rateReq * h), Tokens: int64(ls.rateTok * h)}
	if ls.rateReq == 0 && ls.rateTok == 0 {
		// No history yet: a few requests' worth, but never more than an
		// eighth of the key's capacity, so that the first gateway to see a
		// small key does not lease all of it while others see it empty.
		target = ration.Amount{
			Requests: min(4*max(1, ls.lastCost.Requests), lim.Capacity().Requests/8),
			Tokens:   min(4*ls.lastCost.Tokens, lim.Capacity().Tokens/8),
		}
	}
	target = target.Add(ls.waitSum)
	need := ls.need(lim)
	return lim.Limited(target.Sub(ls.avail).Positive().Max(need))
}

// low reports whether the lease has fallen below its low watermark: what
// the key spends in lead time, plus the last request's cost.
func (ls *leaseState) low(lim ration.Limits, c ration.Amount) bool {
	return (lim.RPM > 0 && ls.avail.Requests < ls.lowWater.Requests+c.Requests) ||
		(lim.TPM > 0 && ls.avail.Tokens < ls.lowWater.Tokens+c.Tokens)
}

// setLowWater sizes the low watermark: what the key spends in lead time at
// its estimated rate.
func (ls *leaseState) setLowWater(lead time.Duration) {
	s := lead.Seconds()
	ls.lowWater = ration.Amount{Requests: int64(ls.rateReq * s), Tokens: int64(ls.rateTok * s)}
}

// idle reports whether the state holds nothing and may be dropped.
func (ls *leaseState) idle(now bucket.Instant) bool {
	ls.valid(now)
	return ls.avail == ration.Amount{} && ls.outstanding == ration.Amount{} && ls.debt == ration.Amount{} && ls.ret == ration.Amount{} &&
		!ls.queued && !ls.inCall && ls.notBefore <= now && now.Sub(ls.lastUse) > time.Minute
}

// status estimates the key's global budget for headers: the global bucket
// as of the last answer, refilled since at the key's rate, plus what this
// lease still holds (which the global bucket already counts as taken);
// and the time the bucket needs to be full again from there. With one
// spender this is exact; with several, other spenders' unspent leases and
// spending since the last answer are not seen.
func (ls *leaseState) status(lim ration.Limits, now bucket.Instant) Status {
	req, tok := ls.remaining(lim, now)
	return leasedStatus(lim, req, tok)
}

// remaining is the Remaining part of status, per dimension (0 for an
// unlimited one). A reservation keeps only these and computes the rest of
// its Status when asked.
func (ls *leaseState) remaining(lim ration.Limits, now bucket.Instant) (req, tok int64) {
	age := float64(max(0, int64(now-ls.snapAt)))
	// Floating point suffices here: these numbers are what a client is
	// told, never what is admitted.
	windowUs := float64(lim.Period() / time.Microsecond)
	dim := func(rate, limit, snapRem, avail int64) int64 {
		perUs := float64(rate) / windowUs
		remaining := max(0, avail)
		if ls.hasSnap {
			remaining += min(limit, max(0, snapRem)+int64(min(float64(limit), age*perUs)))
		}
		return min(limit, remaining)
	}
	capacity := lim.Capacity()
	if lim.RPM > 0 {
		req = dim(lim.RPM, capacity.Requests, ls.snapRem.Requests, ls.avail.Requests)
	}
	if lim.TPM > 0 {
		tok = dim(lim.TPM, capacity.Tokens, ls.snapRem.Tokens, ls.avail.Tokens)
	}
	return req, tok
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

// toAmount is c on the wire, clamped to the protocol's range: amounts
// above it saturate rather than make the allocator refuse the whole call.
func toAmount(c ration.Amount) *leasev1.Amount {
	c = c.Clamp()
	return &leasev1.Amount{Requests: c.Requests, Tokens: c.Tokens}
}

func fromAmount(a *leasev1.Amount) ration.Amount {
	return ration.Amount{Requests: a.GetRequests(), Tokens: a.GetTokens()}
}

func toLimits(l ration.Limits) *leasev1.Limits {
	return &leasev1.Limits{Rpm: l.RPM, Tpm: l.TPM, BurstRequests: l.BurstRequests, BurstTokens: l.BurstTokens,
		WindowSeconds: uint32(l.Window / time.Second)}
}
