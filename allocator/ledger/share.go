package ledger

import (
	"math/big"
	"math/bits"
	"slices"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// Refill shares (docs/bound.md, "Refill shares"). A holding may carry a
// share: a fraction of the key's refill rate that its spender adds to its
// own lease until the holding expires. The ledger keeps the bound with
// three rules, each in one place:
//
//   - the key's buckets refill at the rate the unexpired shares leave them
//     (keyState.advance), so the fleet together refills at most at rho;
//   - a holding grows by its share's accrual, rounded up, from the answer
//     that granted it (holding.accrue): the ledger's count stays an upper
//     bound of what the spender may hold, since the spender accrues rounded
//     down, from receipt, never while a call carrying the key is in flight,
//     and stops at the share's burst;
//   - the cap counts each holding at its potential, what it may grow to
//     (holding.potential), and a share's burst is cut to the room under
//     the cap when it is granted (State.shareKey): the level never has to
//     go below zero to make room for accrual.

// potential is what h may grow to before its next call: its holding, or
// its share's growth limit if that is higher.
func (h *holding) potential() ration.Amount { return h.held.Max(h.growTo) }

// potential sums every holding's potential.
func (k *keyState) potential() (p ration.Amount) {
	for i := range k.holds {
		p = p.Add(k.holds[i].potential())
	}
	return p
}

// freeShare is the part of the refill rate no unexpired holding's share
// takes, per dimension, in millionths.
func (k *keyState) freeShare() ration.Share {
	var r, t uint64
	for i := range k.holds {
		s := k.holds[i].shareOf(k.lim)
		r += uint64(s.Requests)
		t += uint64(s.Tokens)
	}
	return ration.Share{Requests: uint32(ration.ShareUnit - min(r, ration.ShareUnit)), Tokens: uint32(ration.ShareUnit - min(t, ration.ShareUnit))}
}

// shareOf is h's share as a fraction of lim's rates: its own when it was
// granted on lim, otherwise what its spender's accrual (at the rates of
// the limits it was granted on) is of lim's, rounded up, at most the whole
// rate. After a limit decrease the shares granted before it may then take
// the whole rate until they are renewed, like leases granted before it.
func (h *holding) shareOf(lim ration.Limits) ration.Share {
	if h.share.Zero() || h.shareLim == ratesOf(lim) {
		return h.share
	}
	return ration.Share{
		Requests: rescale(h.share.Requests, h.shareLim.RPM, h.shareLim.Period(), lim.RPM, lim.Period()),
		Tokens:   rescale(h.share.Tokens, h.shareLim.TPM, h.shareLim.Period(), lim.TPM, lim.Period()),
	}
}

// rescale is ppm of rate per period as millionths of rate2 per period2,
// rounded up, at most ShareUnit (0 when either rate is unlimited).
func rescale(ppm uint32, rate int64, period time.Duration, rate2 int64, period2 time.Duration) uint32 {
	if ppm == 0 || rate <= 0 || rate2 <= 0 {
		return 0
	}
	num := new(big.Int).Mul(big.NewInt(int64(ppm)), big.NewInt(rate))
	num.Mul(num, big.NewInt(int64(period2/time.Microsecond)))
	den := new(big.Int).Mul(big.NewInt(rate2), big.NewInt(int64(period/time.Microsecond)))
	q, r := num.QuoRem(num, den, new(big.Int))
	if r.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsUint64() || q.Uint64() > ration.ShareUnit {
		return ration.ShareUnit
	}
	return uint32(q.Uint64())
}

// accrue adds every holding's share accrual up to to.
func (k *keyState) accrue(to bucket.Instant) {
	for i := range k.holds {
		k.holds[i].accrue(to)
	}
}

// accrue adds h's share accrual from shareFrom to min(to, expiry), rounded
// up, at the rates of the limits it was granted on (its spender's), to its
// holding, up to growTo in each dimension.
func (h *holding) accrue(to bucket.Instant) {
	if h.share.Zero() {
		return
	}
	total := h.shareLim.Accrued(h.share, min(to, h.expiry).Sub(h.shareFrom), true)
	add := total.Sub(h.accrued).Positive()
	h.accrued = h.accrued.Max(total)
	grow := func(held *int64, add, to int64) {
		if *held < to {
			*held = min(satAdd(*held, add), to)
		}
	}
	grow(&h.held.Requests, add.Requests, h.growTo.Requests)
	grow(&h.held.Tokens, add.Tokens, h.growTo.Tokens)
}

// setShare replaces h's share at now with s of lim's rates and burst b:
// accrual counts from now, and the holding may grow to b (or stays where
// it is if higher). Without a share every share field is zero, shareFrom
// too: a key record leaves them out when no holding has a share, so a
// replica that restored it must hold the same as one that did not.
func (h *holding) setShare(s ration.Share, lim ration.Limits, b ration.Amount, now bucket.Instant) {
	h.share, h.shareFrom, h.accrued = s, 0, ration.Amount{}
	h.shareLim, h.growTo = ration.Limits{}, ration.Amount{}
	if !s.Zero() {
		h.shareLim, h.growTo, h.shareFrom = ratesOf(lim), b, now
	}
}

// ratesOf is lim's rates and window, what an accrual depends on.
func ratesOf(lim ration.Limits) ration.Limits {
	return ration.Limits{RPM: lim.RPM, TPM: lim.TPM, Window: lim.Window}
}

// refillTime is how long lim's bucket takes to refill tokens at the free
// fraction (millionths) of its rate, rounded up to the microsecond;
// bucket.InfDuration when nothing is free.
func refillTime(lim bucket.Limit, tokens int64, free uint32) time.Duration {
	if tokens <= 0 {
		return 0
	}
	if free == 0 {
		return bucket.InfDuration
	}
	// tokens × Period × ShareUnit / (Refill × free) microseconds.
	hi, lo := bits.Mul64(uint64(tokens), uint64(lim.Period/time.Microsecond)*ration.ShareUnit)
	div := uint64(lim.Refill) * uint64(free) // Refill <= MaxRate: fits
	if hi >= div {
		return bucket.InfDuration
	}
	q, r := bits.Div64(hi, lo, div)
	if r != 0 {
		q++
	}
	if q > uint64(bucket.InfDuration/time.Microsecond) {
		return bucket.InfDuration
	}
	return time.Duration(q) * time.Microsecond
}

// shareBurstTime is how much of its share a spender may bank on top of
// what it holds: accrual stops at half a TTL's worth (or the spender's
// want or its waiting request's cost, if larger), about what it spends
// between two renewals.
func shareBurstTime(ttl time.Duration) time.Duration { return ttl / 2 }

// tooSlowToShare reports whether lim's whole request refill would not
// accrue a request between two renewals (shareBurstTime): split in shares,
// it would sit in fractions at every spender, none of which could admit the
// next request, and a retry told to come back when the key's bucket covers
// it would find the budget spread out. A key that slow (3 RPM on a 10 s
// TTL, 5 a day) is served from its bucket, a call per admission. (Tokens
// say nothing of a request; a key without a request limit is not judged.)
func (s *State) tooSlowToShare(lim ration.Limits) bool {
	return lim.RPM > 0 && lim.Accrued(ration.Share{Requests: ration.ShareUnit}, shareBurstTime(s.cfg.TTL), false).Requests < 1
}

// shareKey sets the share of holding i of ks at now, for a call whose key
// part is k: none without a demand, nor in a dimension where a holding of
// its credential owes (its debt took the level below zero); otherwise the share
// policy's answer per limited dimension, with each credential's demands
// counted at most at its max-min part of the rate (perCredential), within
// what other shares leave free, with a burst cut to the room under the cap
// (a dimension with no room gets no share).
//
// It returns the share, its burst and the fair share (the policy's answer
// before that clamp).
func (s *State) shareKey(ks *keyState, i int, k *AcquireKey, now bucket.Instant) (sh ration.Share, burst ration.Amount, fair ration.Share) {
	h := &ks.holds[i]
	h.demand = k.Demand
	if k.Demand == (ration.Amount{}) || s.tooSlowToShare(ks.lim) {
		h.setShare(ration.Share{}, ration.Limits{}, ration.Amount{}, now)
		return ration.Share{}, ration.Amount{}, ration.Share{}
	}
	demands := make([]uint32, len(ks.holds))
	var others ration.Amount // other holdings' potential
	for j := range ks.holds {
		if j != i {
			others = others.Add(ks.holds[j].potential())
		}
	}
	split := func(d *dim, demand func(*holding) int64, share func(*holding) uint32, owed func(*holding) int64, other int64) (ppm, fair uint32, room int64) {
		if !d.on || demand(h) <= 0 || d.b.Last() > now {
			// (A bucket whose refill starts later, a key whose state was
			// lost, has no refill to share yet.)
			return 0, 0, 0
		}
		// In its credential's debt (overruns, fallback admissions that
		// took the level below zero; settleDebts forgets them once it is
		// back): the refill pays it first, as it would without shares,
		// while other credentials' holdings keep theirs.
		if slices.ContainsFunc(ks.holds, func(o holding) bool { return o.use == h.use && owed(&o) > 0 }) {
			return 0, 0, 0
		}
		lim := d.b.Limit()
		var taken uint64
		for j := range ks.holds {
			// A credential in debt counts its demands, taking no share: its
			// part of the rate pays the debt.
			demands[j] = demandShare(demand(&ks.holds[j]), lim)
			if j != i {
				taken += uint64(share(&ks.holds[j]))
			}
		}
		perCredential(ks.holds, demands)
		fair = min(s.cfg.SharePolicy.Share(ShareDemand{Demand: demands[i], Demands: demands}), ration.ShareUnit)
		ppm = min(fair, uint32(ration.ShareUnit-min(taken, ration.ShareUnit)))
		if ppm == 0 {
			return 0, fair, 0
		}
		level, scale := d.b.Level()
		room = capUnits(&d.b, s.cfg.TTL, s.cfg.Strict)/scale - (max(level, 0)+scale-1)/scale - other
		return ppm, fair, room
	}
	var room ration.Amount
	sh.Requests, fair.Requests, room.Requests = split(&ks.req, func(h *holding) int64 { return h.demand.Requests }, func(h *holding) uint32 { return h.shareOf(ks.lim).Requests }, func(h *holding) int64 { return h.owed.Requests }, others.Requests)
	sh.Tokens, fair.Tokens, room.Tokens = split(&ks.tok, func(h *holding) int64 { return h.demand.Tokens }, func(h *holding) uint32 { return h.shareOf(ks.lim).Tokens }, func(h *holding) int64 { return h.owed.Tokens }, others.Tokens)
	// The burst sits on top of what the spender holds (its lease from the
	// bucket is spent alongside the share: a burst below it would drop the
	// share's accrual until the lease is spent), within the room.
	bank := ks.lim.Accrued(sh, shareBurstTime(s.cfg.TTL), false).Max(k.Need).Max(k.Want)
	burst = h.held.Add(bank).Min(room)
	if sh.Requests == 0 || burst.Requests <= h.held.Requests {
		sh.Requests, burst.Requests = 0, 0
	}
	if sh.Tokens == 0 || burst.Tokens <= h.held.Tokens {
		sh.Tokens, burst.Tokens = 0, 0
	}
	h.setShare(sh, ks.lim, burst, now)
	return sh, burst, fair
}

// demandShare is a demand per minute as millionths of lim's rate, rounded
// up, at most MaxShareDemand.
func demandShare(perMinute int64, lim bucket.Limit) uint32 {
	if perMinute <= 0 {
		return 0
	}
	// perMinute × Period / (Refill × 1 min) × ShareUnit = perMinute × Period_us / (Refill × 60).
	hi, lo := bits.Mul64(uint64(perMinute), uint64(lim.Period/time.Microsecond))
	div := uint64(lim.Refill) * 60
	if hi >= div {
		return MaxShareDemand
	}
	q, r := bits.Div64(hi, lo, div)
	if r != 0 {
		q++
	}
	return uint32(min(q, MaxShareDemand))
}

// perCredential scales the demands (demands[j] of holds[j], millionths of
// the rate) so that each credential's together count at most its max-min
// fair part of the rate: water filling over the credentials' totals, each
// credential's demands scaled alike. Within a credential the share policy
// still sees the demands in proportion, so a fleet that shares one token
// splits the rate as before; across credentials, a caller cannot claim
// more than an equal split of what the others leave, whatever it sends.
// With one credential among the demands it changes nothing.
func perCredential(holds []holding, demands []uint32) {
	type part struct {
		use   *usage
		total uint64
	}
	var parts []part
	for j := range holds {
		if demands[j] == 0 {
			continue
		}
		k := slices.IndexFunc(parts, func(p part) bool { return p.use == holds[j].use })
		if k < 0 {
			parts = append(parts, part{use: holds[j].use})
			k = len(parts) - 1
		}
		parts[k].total += uint64(demands[j])
	}
	if len(parts) < 2 {
		return
	}
	totals := make([]uint32, len(parts))
	for k, p := range parts {
		totals[k] = uint32(min(p.total, MaxShareDemand))
	}
	level := uint64(waterLevel(totals, 0))
	for j := range holds {
		if demands[j] == 0 {
			continue
		}
		p := parts[slices.IndexFunc(parts, func(p part) bool { return p.use == holds[j].use })]
		if p.total > level {
			demands[j] = uint32(uint64(demands[j]) * level / p.total)
		}
	}
}
