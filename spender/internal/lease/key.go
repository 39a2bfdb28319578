package lease

import (
	"math"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// Key is one key's share of its global budget in a leased Limiter: its
// lease, what it has to report, its refill share and the estimates the
// calls carry. Only limited dimensions are tracked; an unlimited one is
// never short. A Key is not safe for concurrent use: its owner's lock
// guards it.
type Key struct {
	// The fields an admission and a settlement touch come first, together,
	// so that a key's turn costs as few cache lines as it can.
	id       string
	lim      ration.Limits // the limits the key's last request carried
	capacity ration.Amount // lim's, derived when lim is set (the admit path reads it)
	// basis is what Remaining reads besides the lease, made anew when the
	// limits or the snapshot change, so that a reservation keeps it and
	// computes its Status only when asked.
	basis *Basis

	expiry      bucket.Instant // when avail stops being spendable
	avail       ration.Amount  // granted and unspent; spendable while now < expiry
	outstanding ration.Amount  // admitted and not yet settled (counted as held)
	lowWater    ration.Amount  // refresh when the lease falls below this plus a request
	spentTotal  ration.Amount  // spent since the state was made, net of refunds
	// reserved is what was reserved at admission since the state was made
	// (spentTotal before refunds): a dimension that reserves far more than
	// it uses asks for no share.
	reserved ration.Amount
	// lastCost is a request's cost recorded before the spend rate is
	// known, to size the first asks (want).
	lastCost ration.Amount
	lastUse  bucket.Instant
	// ss is the key's refill share and demand estimate; nil until the key
	// first gets a share or refuses a request (most keys never do, and
	// the state of every key stays small).
	ss *shareState
	// cost is the last cost seen since the share state was made: the
	// share rules' unit. It is the key's, not the share state's, so that
	// an admission writes no other memory.
	cost     ration.Amount
	rejected error  // the allocator refused the key's entry as invalid (ErrKeyRejected)
	gen      uint32 // moves on each time the lease is seen to expire
	queued   bool   // waiting for the next Acquire
	inCall   bool   // in the Acquire being sent
	rated    bool   // the spend rate's rateAt and rateBase are set

	// The key's global state as of the last answer, for headers: whole
	// units left in the global buckets.
	snapRem    ration.Amount
	snapShared ration.Share // the part of the refill rate shares took, for the fallback
	snapAt     bucket.Instant
	hasSnap    bool

	debt ration.Amount // spent beyond any grant, not yet reported
	ret  ration.Amount // to give back on the next call
	// counted is what the allocator's last answer counted this spender as
	// holding (unsettled requests at the call included): an idle key tells
	// it when it holds less, so that the allocator's count is 0 too.
	counted ration.Amount

	// After NOT_COVERED: the global buckets cover the need from coveredAt
	// (the allocator's exact wait), and the key answers locally until askAt
	// (coveredAt, or a renewal period after the answer if sooner).
	coveredAt, askAt bucket.Instant
	shortDim         Dim // the dimension that was short then

	waitMax ration.Amount // the largest cost a waiting Reserve needs
	waitSum ration.Amount // the sum of the costs waiting Reserves need

	active uint32 // spenders holding a lease on the key, per the allocator

	// Spend rate, estimated at each call from spentTotal.
	rateAt           bucket.Instant
	rateBase         ration.Amount
	rateReq, rateTok float64 // per second

	// fb is the key's fallback buckets, at this spender's part of the
	// key's limits (nil until the key first falls back). fbOn: they are
	// this outage's, made when the key first fell back and kept until an
	// answer ends the outage for the key (the next one starts from that
	// answer).
	fb   *Buckets
	fbOn bool
}

// NewKey returns the state of key id at limits lim, first seen at now: no
// lease, nothing to report.
func NewKey(id string, lim ration.Limits, now bucket.Instant) *Key {
	k := &Key{id: id, lastUse: now}
	k.setLimits(lim)
	return k
}

// setLimits sets the key's limits and what derives from them.
func (k *Key) setLimits(lim ration.Limits) {
	k.lim, k.capacity = lim, lim.Capacity()
	k.setBasis()
}

// Basis is what a key's Remaining reads besides its lease: its limits and
// the global buckets as the last answer reported them. It is immutable (a
// key makes a new one when either changes), so a reservation may keep it.
type Basis struct {
	Lim      ration.Limits
	capacity ration.Amount
	perUs    [2]float64 // each dimension's refill per microsecond (0 for an unlimited one)
	snapRem  ration.Amount
	snapAt   bucket.Instant
	hasSnap  bool
}

// setBasis makes the key's Basis anew from its limits and snapshot.
func (k *Key) setBasis() {
	windowUs := float64(k.lim.Period() / time.Microsecond)
	k.basis = &Basis{Lim: k.lim, capacity: k.capacity, perUs: [2]float64{float64(k.lim.RPM) / windowUs, float64(k.lim.TPM) / windowUs},
		snapRem: k.snapRem, snapAt: k.snapAt, hasSnap: k.hasSnap}
}

// Basis returns what the key's Remaining reads besides its lease, for a
// reservation to keep with Avail.
func (k *Key) Basis() *Basis { return k.basis }

// Avail returns the key's unspent lease (spendable while it is valid).
func (k *Key) Avail() ration.Amount { return k.avail }

// ID returns the key.
func (k *Key) ID() string { return k.id }

// Limits returns the limits the key's last request carried.
func (k *Key) Limits() ration.Limits { return k.lim }

// SetLimits records new limits from a request: a new question for the
// allocator, so a key it rejected may ask again.
func (k *Key) SetLimits(lim ration.Limits) {
	k.setLimits(lim)
	k.rejected = nil
}

// Rejected is the allocator's refusal of the key's entry as invalid
// (nil if none), until its limits change.
func (k *Key) Rejected() error { return k.rejected }

// Gen returns the lease's generation: a reservation admitted from the
// lease remembers it, and Settle knows from it whether the lease is still
// the one it came from.
func (k *Key) Gen() uint32 { return k.gen }

// shareState is a key's refill share: a fraction of the key's refill rate
// the allocator lets this spender add to its own lease, continuously,
// until the lease expires (see docs/leasing.md, "Rate shares"), and what
// the key's traffic asked, which the share follows.
type shareState struct {
	acc   accrual        // what the share credited, as admissions look at it (see accrue); first, for the admit path
	share ration.Share   // per dimension, in millionths of the refill rate; zero = none
	fair  ration.Share   // the allocator's fair share for the demand; above share, others still hold the rest
	lim   ration.Limits  // the limits the share was granted on (sent in that call)
	burst ration.Amount  // accrual stops while avail + outstanding reach this
	from  bucket.Instant // receipt of the answer that granted it: accrual counts from here
	sent  bucket.Instant // first send of the last call that carried the key
	// carried is the fraction of a unit the previous share left over,
	// added to this one's accrual; left is the fraction left at the last
	// look of a share that ended, carried into the next. Renewed every few
	// seconds, a small share would otherwise lose half a unit per renewal
	// to rounding (4% of a gateway's part of 600 requests a minute among
	// four). What this share credited is the key's acc.
	carried, left ration.Remainder
	// paused: a call carrying the key was sent and its answer not yet
	// applied. Nothing accrues until an answer brings a new share, so that
	// the held reported in that call stays the most this spender may hold.
	paused bool

	refused      ration.Amount  // costs refused since the last rate update
	lastRefused  bucket.Instant // the last refusal
	refusedTotal ration.Amount  // costs refused since the state was made
	// Demand (admitted and refused) per second: an exponentially weighted
	// rate with a time constant of tau(), brought up to date at every
	// maintenance tick and call (demAt, with what had been asked by then
	// in demBase), so that a share follows traffic that moves within a
	// second or two, not a few calls.
	demReq, demTok float64
	demAt          bucket.Instant
	demBase        ration.Amount
	demSet         bool          // demAt and demBase are set
	demWarm        bool          // the estimate has had its first interval
	sentDem        ration.Amount // the demand sent with the call that granted the share, per minute
}

// shares returns k's share state, making it: its demand estimate starts
// at the spend rate (what it was while no refusal was counted).
func (k *Key) shares() *shareState {
	if k.ss == nil {
		k.ss = &shareState{demReq: k.rateReq, demTok: k.rateTok}
		k.cost = ration.Amount{}
	}
	return k.ss
}

// setShare replaces k's share with the one an answer received at recv
// carried (zero: none), with the fair share it named (hasFair false: the
// share), granted on lim for the call first sent at sent that reported
// demand dem (per minute). It resumes accrual, from recv.
func (k *Key) setShare(share ration.Share, burst ration.Amount, fair ration.Share, hasFair bool, lim ration.Limits, dem ration.Amount, sent, recv bucket.Instant) {
	if k.ss == nil && share.Zero() && !hasFair {
		return
	}
	ss := k.shares()
	k.keepLeft()
	ss.trackDemand(k.spentTotal, k.cost, recv)
	ss.share, ss.lim, ss.burst, ss.fair = share, lim, burst, share
	if hasFair {
		ss.fair = fair
	}
	ss.from, ss.sent, ss.paused = recv, sent, false
	ss.carried = ss.left
	ss.sentDem = dem
	k.startAccrual()
}

// refuse counts c, refused at now, as demand.
func (k *Key) refuse(c ration.Amount, now bucket.Instant) {
	ss := k.shares()
	ss.trackDemand(k.spentTotal, k.cost, now) // (starts the estimate before counting c)
	c = k.lim.Limited(c)
	ss.refused = ss.refused.Add(c)
	ss.refusedTotal = ss.refusedTotal.Add(c)
	ss.lastRefused, k.cost = now, c
}

// demand is what the key's traffic asks per minute (admitted and
// refused), in its limited dimensions (the spend rate until a share
// state exists, then its demand estimate);
// 0 once the key has seen no traffic for idle (a lease TTL: the estimate
// alone only halves at each call), or, with a share, for as long as would
// have seen sixteen requests at the demand it last reported (silent),
// which gives its share back.
func (k *Key) demand(now bucket.Instant, idle time.Duration) ration.Amount {
	r, t, gap := k.rateReq, k.rateTok, now.Sub(k.lastAsked())
	stopped := idle > 0 && gap >= idle
	if ss := k.ss; ss != nil {
		ss.trackDemand(k.spentTotal, k.cost, now)
		r, t = ss.demReq, ss.demTok
		if stopped = idle > 0 && (gap >= idle || ss.silent(gap, k.cost)); stopped {
			ss.demReq, ss.demTok = 0, 0 // start again from the next traffic
		}
	}
	if stopped {
		return ration.Amount{}
	}
	d := k.lim.Limited(ration.Amount{Requests: int64(r * 60), Tokens: int64(t * 60)})
	// A dimension whose requests reserve far more than they use (tokens
	// reserved up to max_tokens) asks for no share: its pool must hold the
	// reservations in flight, which a share sized to use cannot refill in
	// time, and the refill it would divert would be dropped at the burst.
	// Its leases come from the bucket, as without shares.
	if overReserves(k.reserved.Requests, k.spentTotal.Requests) {
		d.Requests = 0
	}
	if overReserves(k.reserved.Tokens, k.spentTotal.Tokens) {
		d.Tokens = 0
	}
	return d
}

// lastAsked is the key's last traffic: its last admission, or its last
// refusal once it has a share state (which counts refusals).
func (k *Key) lastAsked() bucket.Instant {
	if k.ss == nil {
		return k.lastUse
	}
	return max(k.lastUse, k.ss.lastRefused)
}

// silent reports whether a key that saw no traffic for gap has stopped:
// at the demand last reported, gap would have seen sixteen requests of the
// last cost (in some dimension), which a Poisson stream at that rate
// fails to send once in ten million tries. Its share then goes back at
// once, rather than through renewals that follow the estimate down: it
// halves in 0.7 time constants, and each renewal since the last reports
// only that.
func (ss *shareState) silent(gap time.Duration, cost ration.Amount) bool {
	if gap <= 0 {
		return false
	}
	sec := gap.Seconds() / 60 // the demand is per minute
	return float64(ss.sentDem.Requests)*sec >= 16*float64(max(1, cost.Requests)) && ss.sentDem.Requests > 0 ||
		float64(ss.sentDem.Tokens)*sec >= 16*float64(max(1, cost.Tokens)) && ss.sentDem.Tokens > 0
}

// overReserves reports whether what was reserved is more than one and a
// half times what was used.
func overReserves(reserved, used int64) bool { return 2*reserved > 3*max(used, 0) && reserved > 0 }

// valid reports whether the lease may be spent at now, dropping it if not:
// budget from an expired lease is never spent (invariant 1). Dropping a
// lease moves the generation on, so that reservations made from it know.
func (k *Key) valid(now bucket.Instant) bool {
	if now < k.expiry {
		return true
	}
	if k.avail != (ration.Amount{}) || k.gen == 0 {
		k.avail = ration.Amount{}
		k.gen++
	}
	return false
}

// covers reports whether the lease covers c in every limited dimension.
func (k *Key) covers(c ration.Amount) bool {
	return (k.lim.RPM == 0 || k.avail.Requests >= c.Requests) && (k.lim.TPM == 0 || k.avail.Tokens >= c.Tokens)
}

// spend moves c from the lease to outstanding and records it.
func (k *Key) spend(c ration.Amount, now bucket.Instant) {
	c = k.lim.Limited(c)
	k.avail = k.avail.Sub(c)
	k.outstanding = k.outstanding.Add(c)
	k.record(c, now)
}

// record counts c as spent now, for the rate estimate and the headers.
func (k *Key) record(c ration.Amount, now bucket.Instant) {
	k.spentTotal = k.spentTotal.Add(c)
	k.reserved = k.reserved.Add(c)
	if !k.rated {
		k.lastCost = c
	}
	k.cost = c
	k.lastUse = now
}

// Settle applies the actual usage of a reservation of reserved admitted
// from the lease's generation gen: a refund goes back into a valid lease
// (or is lost with an expired one: returns cannot mint), an overrun is
// taken from the lease and the rest becomes debt.
//
// It needs no clock. A lease that expired since the reservation was made
// has been seen to expire (its generation moved on) or has not been looked
// at since: then a refund added to it is dropped at the next look, before
// anyone can spend it, and an overrun taken from it consumes budget that
// was granted and never returned.
func (k *Key) Settle(reserved, actual ration.Amount, gen uint32) {
	lim := k.lim
	reserved, actual = lim.Limited(reserved), lim.Limited(actual)
	k.outstanding = k.outstanding.Sub(reserved)
	k.outstanding = ration.Amount{Requests: max(0, k.outstanding.Requests), Tokens: max(0, k.outstanding.Tokens)}
	k.spentTotal = k.spentTotal.Add(actual.Sub(reserved))
	valid := gen == k.gen
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
	dr := adjust(&k.avail.Requests, reserved.Requests, actual.Requests)
	dt := adjust(&k.avail.Tokens, reserved.Tokens, actual.Tokens)
	if dr != 0 || dt != 0 { // only then touch the cold part
		k.debt = k.debt.Add(ration.Amount{Requests: dr, Tokens: dt})
	}
}

// SettleAhead applies the actual usage of a reservation made at the
// allocator ahead (wait mode), for a send time the local lease does not
// cover: a refund goes back to the allocator on the next call, an overrun
// is debt.
func (k *Key) SettleAhead(reserved, actual ration.Amount) {
	rc, ac := k.lim.Limited(reserved), k.lim.Limited(actual)
	k.outstanding = k.outstanding.Sub(rc).Positive()
	d := rc.Sub(ac)
	k.ret = k.ret.Add(d.Positive())
	k.debt = k.debt.Add(ration.Amount{}.Sub(d).Positive())
}

// SettleFallback applies the actual usage of a fallback admission: the
// difference is debt, and it is refunded to or taken from this outage's
// fallback buckets, as of their last refill (the next admission refills
// them).
func (k *Key) SettleFallback(reserved, actual ration.Amount) {
	k.debt = k.debt.Add(k.lim.Limited(actual).Sub(k.lim.Limited(reserved))).Positive()
	if k.fbOn {
		refund := reserved.Sub(actual)
		k.fb.Give(refund.Positive())
		k.fb.Take(ration.Amount{}.Sub(refund).Positive())
	}
}

// Refusal is a refused cost: the dimension that was short (or that the
// cost can never fit), the wait after which it is covered, and the key's
// remaining per dimension as the client is told it.
type Refusal struct {
	Dim      Dim
	Wait     time.Duration
	Oversize bool  // above the capacity of Dim: never admitted, no wait
	Req, Tok int64 // remaining requests and tokens (0 for an unlimited dimension)
	Closed   bool  // refused by the FailClosed policy
}

// oversize reports whether c can never fit the key's limits, and in which
// dimension.
func (k *Key) oversize(c ration.Amount) (Dim, bool) {
	if k.lim.RPM > 0 && c.Requests > k.capacity.Requests {
		return Requests, true
	}
	if k.lim.TPM > 0 && c.Tokens > k.capacity.Tokens {
		return Tokens, true
	}
	return 0, false
}

// rejection is the refusal of c, short in dim (or above its capacity),
// with wait: the key's remaining (see Remaining), except that the refused
// dimension's remaining is below the cost. The estimate of the global
// buckets can read more than this spender can admit now (other spenders'
// leases, refill that goes to their shares, a bucket judged not worth a
// call at saturation), and a refusal must not say "1 requested, 8
// remaining" in its message or headers.
func (k *Key) rejection(c ration.Amount, dim Dim, wait time.Duration, now bucket.Instant) *Refusal {
	req, tok := k.Remaining(now)
	if big, isBig := k.oversize(c); isBig {
		return &Refusal{Dim: big, Oversize: true, Req: req, Tok: tok}
	}
	if dim == Requests {
		req = min(req, max(0, c.Requests-1))
	} else {
		tok = min(tok, max(0, c.Tokens-1))
	}
	return &Refusal{Dim: dim, Wait: wait, Req: req, Tok: tok}
}

// Snapshot is a key's global buckets as an answer reported them: whole
// units remaining, and the part of the refill rate shares took.
type Snapshot struct {
	Remaining ration.Amount
	Shared    ration.Share
}

// setSnapshot records the global state an answer reported at now.
func (k *Key) setSnapshot(sn *Snapshot, now bucket.Instant) {
	if sn == nil {
		return
	}
	k.snapRem, k.snapShared = sn.Remaining, sn.Shared
	k.snapAt, k.hasSnap = now, true
	k.setBasis()
}

// trimTo makes the lease agree with what the allocator says this spender
// holds: the allocator's word is authoritative (after it lost state it
// could not vouch for, it counts old holdings as zero), so an unspent
// lease above it is dropped. Unsettled requests stay admitted.
func (k *Key) trimTo(held ration.Amount) {
	local := k.avail.Add(k.outstanding)
	if k.lim.RPM > 0 && local.Requests > held.Requests {
		k.avail.Requests = max(0, k.avail.Requests-(local.Requests-held.Requests))
	}
	if k.lim.TPM > 0 && local.Tokens > held.Tokens {
		k.avail.Tokens = max(0, k.avail.Tokens-(local.Tokens-held.Tokens))
	}
}

// updateRate refreshes the spend-rate estimate at now (an exponentially
// weighted average of the rate between calls).
func (k *Key) updateRate(now bucket.Instant) {
	if !k.rated {
		k.rated, k.rateAt, k.rateBase = true, now, k.spentTotal
		return
	}
	dt := now.Sub(k.rateAt).Seconds()
	if dt < 0.05 {
		return
	}
	// Net spend in the interval: refunds of requests admitted before it can
	// make it negative, which means "spent nothing".
	d := k.spentTotal.Sub(k.rateBase)
	r, t := max(0, float64(d.Requests)/dt), max(0, float64(d.Tokens)/dt)
	if k.rateReq == 0 && k.rateTok == 0 {
		k.rateReq, k.rateTok = r, t
	} else {
		k.rateReq, k.rateTok = 0.5*k.rateReq+0.5*r, 0.5*k.rateTok+0.5*t
	}
	if ss := k.ss; ss != nil {
		ss.refused = ration.Amount{}
	}
	k.rateAt, k.rateBase = now, k.spentTotal
}

// The demand estimate's time constant is the time its rate takes to send
// demandCount requests, within [demandTau, maxDemandTau]: a busy gateway's
// estimate follows its traffic within a second, and a quiet one's (a
// request a second: one of 64 gateways at the limit) is not made of one or
// two requests. At a fixed one-second constant the quiet one's estimate
// was off by 70% of its rate (root mean square), and its share and its
// fallback rate took that as it was; now by 37%. A constant that follows
// the estimate makes it slower to rise from a low value than to fall back
// to it, which biases it low between about 0.5 and 3 requests a second
// (12% at 1 and 2 a second; TestDemandEstimateTimeConstant).
const (
	demandTau    = time.Second
	maxDemandTau = 5 * time.Second
	demandCount  = 3
)

// tau is the demand estimate's time constant at its current value: the
// time the larger of its request and token rates (tokens counted in the
// last cost's) takes to send demandCount requests. An estimate at zero (no
// traffic yet, or a key that stopped) takes the next traffic at the
// shortest constant, so that a share follows a gateway that just got busy.
func (ss *shareState) tau(cost ration.Amount) time.Duration {
	perSec := ss.demReq
	if c := cost.Tokens; c > 0 {
		perSec = max(perSec, ss.demTok/float64(c))
	}
	if perSec <= 0 {
		return demandTau
	}
	sec := min(max(demandCount/perSec, demandTau.Seconds()), maxDemandTau.Seconds())
	return time.Duration(sec * float64(time.Second))
}

// trackDemand brings the demand estimate up to now: the rate asked
// (admitted, net of refunds, plus refused) since the last update, weighted
// by 1 - e^(-dt/tau).
func (ss *shareState) trackDemand(spent, cost ration.Amount, now bucket.Instant) {
	asked := spent.Add(ss.refusedTotal)
	if !ss.demSet {
		ss.demSet, ss.demAt, ss.demBase = true, now, asked
		return
	}
	dt := now.Sub(ss.demAt)
	if dt < demandTau/10 {
		return
	}
	d := asked.Sub(ss.demBase).Positive()
	sec := dt.Seconds()
	a := 1 - math.Exp(-sec/ss.tau(cost).Seconds())
	if !ss.demWarm { // the first interval has no estimate to weigh against
		a, ss.demWarm = 1, true
	}
	ss.demReq += a * (float64(d.Requests)/sec - ss.demReq)
	ss.demTok += a * (float64(d.Tokens)/sec - ss.demTok)
	ss.demAt, ss.demBase = now, asked
}

// need is the least grant worth having for the blocked Reserves: the
// largest one's shortfall against the lease as it is now (so the wait the
// allocator names is the exact global one).
func (k *Key) need() ration.Amount {
	return k.lim.Limited(ration.Amount{Requests: max(0, k.waitMax.Requests-k.avail.Requests), Tokens: max(0, k.waitMax.Tokens-k.avail.Tokens)})
}

// want is what to ask for on top of the lease: spend rate × horizon plus
// what the blocked Reserves wait for (a few requests' worth, at most an
// eighth of the capacity, while the rate is unknown), at least the need.
func (k *Key) want(horizon time.Duration) ration.Amount {
	lim := k.lim
	h := horizon.Seconds()
	target := ration.Amount{Requests: int64(k.rateReq * h), Tokens: int64(k.rateTok * h)}
	if k.rateReq == 0 && k.rateTok == 0 {
		// No history yet: a few requests' worth, at most an eighth of the
		// capacity in tokens too, so that the first gateway to see a small
		// key does not lease all of it while others see it empty.
		target = ration.Amount{Requests: 4 * max(1, k.lastCost.Requests), Tokens: min(4*k.lastCost.Tokens, lim.Capacity().Tokens/8)}
	}
	// Never more than an eighth of the key's capacity in requests, so that
	// one gateway (its rate measured over a few requests, or none) does not
	// lease a small key's budget while others find it empty and tell their
	// clients to wait for the refill (a 5-a-day key leased whole by the
	// gateway that saw its first request). Tokens are not capped: requests
	// reserve far more than they use (up to max_tokens), and a lease must
	// hold the reservations in flight. What the waiting requests need comes
	// on top.
	target.Requests = min(target.Requests, lim.Capacity().Requests/8)
	if k.ss != nil {
		// A key that takes a share asks for at least a request's worth:
		// the allocator sizes the share's burst from it, and a burst below
		// one request (a gateway that sees a request every few seconds)
		// would be no share at all.
		target = target.Max(k.cost)
	}
	target = target.Add(k.waitSum)
	need := k.need()
	return lim.Limited(target.Sub(k.avail).Positive().Max(need))
}

// low reports whether the lease has fallen below its low watermark: what
// the key spends in lead time, plus the last request's cost.
func (k *Key) low(c ration.Amount) bool {
	return (k.lim.RPM > 0 && k.avail.Requests < k.lowWater.Requests+c.Requests) ||
		(k.lim.TPM > 0 && k.avail.Tokens < k.lowWater.Tokens+c.Tokens)
}

// setLowWater sizes the low watermark: what the key spends in lead time at
// its estimated rate.
func (k *Key) setLowWater(lead time.Duration) {
	s := lead.Seconds()
	k.lowWater = ration.Amount{Requests: int64(k.rateReq * s), Tokens: int64(k.rateTok * s)}
}

// fallbackFrom is the instant a key's fallback buckets, made at now for an
// outage, refill from at its fallback share (fallbackStart says at what
// level): when the key stopped getting refill from the allocator. That is
// its last answer, or, with a share, when its accrual paused (the first
// send of the call that went unanswered, after the answer); a key never
// answered starts now. So the fallback goes on where the allocator left
// off: a gateway whose lease runs out during an outage goes on admitting
// at its share, as it would have with the allocator, rather than from an
// empty bucket (3–5 false 429s a minute at half the limit through a
// failover).
func (k *Key) fallbackFrom(now bucket.Instant) bucket.Instant {
	if !k.hasSnap {
		return now
	}
	from := k.snapAt
	if ss := k.ss; ss != nil && ss.paused {
		from = max(from, ss.sent)
	}
	return min(from, now)
}

// overCounted reports whether a key without a share has spent its lease in
// a dimension and the allocator, as of its last answer, counts it holding
// there requests it has settled since: it tells the allocator at the next
// maintenance tick.
// Until told, the allocator counts them against the key's cap, which in
// strict mode burns the refill meanwhile (a 3 RPM key lost 9.5 s of refill
// after each request, its Retry-After that much late). A key with a share
// renews every half TTL anyway, and one with a lease calls when it runs
// low or idle.
func (k *Key) overCounted() bool {
	return (k.ss == nil || k.ss.share.Zero()) &&
		(k.avail.Requests == 0 && k.counted.Requests > k.outstanding.Requests ||
			k.avail.Tokens == 0 && k.counted.Tokens > k.outstanding.Tokens)
}

// holds reports whether the key holds anything at now: a lease, admitted
// requests not yet settled, a share, something to report, or a call under
// way (the keys_held gauge).
func (k *Key) holds(now bucket.Instant) bool {
	return k.avail != ration.Amount{} || k.outstanding != ration.Amount{} || k.debt != ration.Amount{} || k.ret != ration.Amount{} ||
		k.queued || k.inCall || k.ss != nil && !k.ss.share.Zero() && now < k.expiry
}

// Droppable reports whether the key holds nothing at now and its state may
// be dropped: no lease, nothing outstanding or to report, no call, no wait
// the allocator named still running, a minute without traffic, and, in an
// outage, its fallback buckets full again (kept until then, so that a
// flapping outage does not restart the key with a burst).
func (k *Key) Droppable(now bucket.Instant) bool {
	k.valid(now)
	return k.avail == ration.Amount{} && k.outstanding == ration.Amount{} && k.debt == ration.Amount{} && k.ret == ration.Amount{} &&
		!k.queued && !k.inCall && k.askAt <= now && now.Sub(k.lastUse) > time.Minute &&
		(!k.fbOn || k.fb.FullAt() <= now)
}

// Remaining is what the key's headers say remains per dimension (0 for an
// unlimited one): the global bucket as of the last answer, refilled since
// at the key's rate (capped at capacity), plus what this lease still holds
// (which the global bucket already counts as taken). With one spender
// this is exact; with several, other spenders' unspent leases and spending
// since the last answer are not seen.
func (k *Key) Remaining(now bucket.Instant) (req, tok int64) { return k.basis.Remaining(k.avail, now) }

// Remaining is what a key with unspent lease avail on b has remaining at
// now (see Key.Remaining).
func (b *Basis) Remaining(avail ration.Amount, now bucket.Instant) (req, tok int64) {
	age := float64(max(0, int64(now-b.snapAt)))
	// Floating point suffices here: these numbers are what a client is
	// told, never what is admitted.
	dim := func(perUs float64, limit, snapRem, avail int64) int64 {
		remaining := max(0, avail)
		if b.hasSnap {
			remaining += min(limit, max(0, snapRem)+int64(min(float64(limit), age*perUs)))
		}
		return min(limit, remaining)
	}
	if b.Lim.RPM > 0 {
		req = dim(b.perUs[0], b.capacity.Requests, b.snapRem.Requests, avail.Requests)
	}
	if b.Lim.TPM > 0 {
		tok = dim(b.perUs[1], b.capacity.Tokens, b.snapRem.Tokens, avail.Tokens)
	}
	return req, tok
}

// Holding is what the key holds (its lease and its unsettled admissions),
// as stored and as a look at now would make it (its share's accrual to
// now credited), without changing the key.
func (k *Key) Holding(now bucket.Instant) (stored, looked ration.Amount) {
	stored = k.avail.Add(k.outstanding)
	c := *k
	if k.ss != nil {
		ss := *k.ss
		c.ss = &ss
	}
	c.accrue(now)
	return stored, c.avail.Add(c.outstanding)
}
