package ledger

import (
	"math/bits"
	"slices"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// dim is one dimension of a key: its global bucket, if limited.
type dim struct {
	on bool          // limited; false = unlimited, no bucket
	b  bucket.Bucket // valid when on
}

// holding is what one spender incarnation holds on one key.
type holding struct {
	spender string
	epoch   uint64
	lastSeq uint64         // the last sequence applied to this key for (spender, epoch)
	held    ration.Amount  // counted as held; only the ledger's upper bound of the truth
	rate    ration.Amount  // spend per minute last reported, at most what the key can use in a minute
	expiry  bucket.Instant // the holding stops counting at this instant
	use     *usage         // its spender's credential's (Quota)
	// owed is the debt this holding reported that took the key's level
	// below zero, per dimension, until the level is back at zero (touch
	// forgets it): meanwhile no holding of its credential gets a refill
	// share, so the refill pays the debt first, while other credentials'
	// shares go on (docs/bound.md, "Rules for callers").
	owed ration.Amount

	// A refill share (share.go): held grows by the share's accrual, counted
	// from shareFrom and rounded up, while it is below growTo.
	demand    ration.Amount  // demand per minute last reported; 0 = takes no share
	share     ration.Share   // granted with the last answer, until expiry
	shareLim  ration.Limits  // the limits it was granted on: its spender accrues at their rate
	shareFrom bucket.Instant // when that answer was made
	accrued   ration.Amount  // accrual since shareFrom already added to held
	growTo    ration.Amount  // held grows by accrual up to this; 0 without a share
}

// keyState is one key's global state: a bucket per limited dimension and
// the holdings of every spender incarnation with an unexpired lease.
type keyState struct {
	lim       ration.Limits  // the limits the buckets follow
	req, tok  dim            // request and token buckets
	holds     []holding      // unexpired as of the last touch (expired ones dropped lazily)
	emptyFrom bucket.Instant // != 0: state was lost; buckets start empty at this instant
	fresh     bool           // buckets not created yet (lim unknown)
	owner     *usage         // the credential whose call created the key (Quota); nil: none known
	hash      uint32         // nameHash of the key's name: its part of a partial Sweep
}

// nameHash is FNV-1a (32-bit) of a key's name, which picks its part of a
// partial Sweep: derived from the name alone, so the same on every replica.
func nameHash(name string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(name); i++ {
		h = (h ^ uint32(name[i])) * 16777619
	}
	return h
}

// setLimits makes the buckets follow l: a dimension that becomes limited
// gets a full bucket (or an empty one when the key's state was lost), one
// that changes follows the new limit without minting, one that becomes
// unlimited drops its bucket. l must be valid.
func (k *keyState) setLimits(l ration.Limits, now bucket.Instant) {
	if !k.fresh && l == k.lim {
		return
	}
	rl, _ := l.RequestLimit()
	tl, _ := l.TokenLimit()
	k.setDim(&k.req, rl, l.RPM > 0, now)
	k.setDim(&k.tok, tl, l.TPM > 0, now)
	k.lim = l
	k.fresh = false
	k.emptyFrom = 0
}

func (k *keyState) setDim(d *dim, lim bucket.Limit, on bool, now bucket.Instant) {
	switch {
	case !on:
		*d = dim{}
	case !d.on && k.emptyFrom != 0:
		b, err := bucket.FromState(lim, bucket.State{Level: 0, Last: k.emptyFrom})
		if err != nil { // unreachable for a validated limit; stay safe: start empty now
			b, _ = bucket.FromState(lim, bucket.State{Level: 0, Last: now})
		}
		*d = dim{on: true, b: b}
	case !d.on:
		b, _ := bucket.New(lim, now) // validated by the caller
		*d = dim{on: true, b: b}
	default:
		_ = d.b.SetLimit(lim, now) // validated by the caller
	}
}

// untilHoldingsFit returns how long after now a reservation of n that
// waits for refill can be covered under the level cap, considering only the
// cap: 0 if the holdings with n fit under it. Otherwise the level is held at
// cap - holdings - n < 0 until enough holdings expire (at e), and needs the
// refill of that deficit after e: (e - now) + deficit/rate, rounded up. It
// is the TTL plus that refill if no expiry makes room (only reservations
// that wait outlive the TTL). The caller takes the larger of this and the
// plain bucket wait, which is then exact when the cap does not bind before e
// and conservative when holdings expiring before e loosen it early.
func (k *keyState) untilHoldingsFit(n ration.Amount, now bucket.Instant, ttl time.Duration, strict bool) time.Duration {
	deficit := func(d *dim, held, n int64) int64 {
		if !d.on || n <= 0 {
			return 0
		}
		return max(0, satAdd(held, n)-capUnits(&d.b, ttl, strict)/d.b.Scale())
	}
	free := k.freeShare()
	refill := func(d *dim, tokens int64, free uint32) time.Duration {
		if tokens <= 0 {
			return 0
		}
		return refillTime(d.b.Limit(), tokens, free)
	}
	held := k.potential()
	dr, dt := deficit(&k.req, held.Requests, n.Requests), deficit(&k.tok, held.Tokens, n.Tokens)
	if dr == 0 && dt == 0 {
		return 0
	}
	after := max(refill(&k.req, dr, free.Requests), refill(&k.tok, dt, free.Tokens))
	exp := make([]bucket.Instant, 0, len(k.holds))
	for i := range k.holds {
		exp = append(exp, k.holds[i].expiry)
	}
	slices.Sort(exp)
	for _, e := range exp {
		var h ration.Amount
		for i := range k.holds {
			if k.holds[i].expiry > e {
				h = h.Add(k.holds[i].potential())
			}
		}
		if deficit(&k.req, h.Requests, n.Requests) == 0 && deficit(&k.tok, h.Tokens, n.Tokens) == 0 {
			return max(0, e.Sub(now)) + after
		}
	}
	return ttl + after
}

// rateSum returns the total reported spend rate over all holdings.
func (k *keyState) rateSum() (r ration.Amount) {
	for i := range k.holds {
		r.Requests = satAdd(r.Requests, k.holds[i].rate.Requests)
		r.Tokens = satAdd(r.Tokens, k.holds[i].rate.Tokens)
	}
	return r
}

// touch brings the key to now: refill, enforce the level cap, drop expired
// holdings.
//
// Holdings stop counting at their own expiry, not at the next touch: the
// refill is advanced through each expiry up to now in turn, with the cap
// enforced at the end of each stretch. Between two expiries the holdings
// are constant and the level only rises, so this equals a cap enforced
// continuously (a cap applied only at now would burn refill that arrived
// after the holdings had expired).
func (k *keyState) touch(now bucket.Instant, ttl time.Duration, strict bool) {
	for {
		next, ok := bucket.Instant(0), false
		for i := range k.holds {
			if e := k.holds[i].expiry; e <= now && (!ok || e < next) {
				next, ok = e, true
			}
		}
		if !ok {
			break
		}
		k.advance(next)
		k.accrue(next)
		k.enforceCap(ttl, strict)
		k.expire(next)
	}
	k.advance(now)
	k.accrue(now)
	k.enforceCap(ttl, strict)
	k.expire(now)
	k.settleDebts()
}

// advance refills the buckets to now at the rate the refill shares leave
// them (share.go): the shared part refills the spenders' leases instead.
func (k *keyState) advance(now bucket.Instant) {
	free := k.freeShare()
	if k.req.on {
		k.req.b.AdvanceFraction(now, uint64(free.Requests), ration.ShareUnit)
	}
	if k.tok.on {
		k.tok.b.AdvanceFraction(now, uint64(free.Tokens), ration.ShareUnit)
	}
}

// anyExpired reports whether some holding's expiry is at or before now.
func (k *keyState) anyExpired(now bucket.Instant) bool {
	for i := range k.holds {
		if k.holds[i].expiry <= now {
			return true
		}
	}
	return false
}

// expire drops holdings whose expiry is at or before now, uncounting
// them. (A loop, not dropHoldings: touch runs it on every key a call names,
// and a closure there cost an allocation per key.)
func (k *keyState) expire(now bucket.Instant) {
	n := 0
	for i := range k.holds {
		if h := &k.holds[i]; h.expiry <= now {
			if h.use != nil {
				h.use.leases--
			}
			continue
		}
		k.holds[n] = k.holds[i]
		n++
	}
	clear(k.holds[n:])
	k.holds = k.holds[:n]
}

// enforceCap keeps level + potential holdings <= capK in each dimension by
// burning the excess refill (docs/bound.md: this is what stops
// returned-and-regranted tokens from accumulating beyond the bound). A
// holding's potential is what it may grow to by its share's accrual
// (holding.potential), so accrual never needs the level below zero.
func (k *keyState) enforceCap(ttl time.Duration, strict bool) {
	held := k.potential()
	if k.req.on {
		burn(&k.req.b, held.Requests, ttl, strict)
	}
	if k.tok.on {
		burn(&k.tok.b, held.Tokens, ttl, strict)
	}
}

// capUnits returns the cap on level + held for b in fixed-point units:
// Capacity in strict mode, Capacity + Refill/Period × ttl otherwise.
func capUnits(b *bucket.Bucket, ttl time.Duration, strict bool) int64 {
	lim := b.Limit()
	scale := b.Scale()
	full := lim.Capacity * scale // fits: Limit.Validate
	if strict || ttl <= 0 {
		return full
	}
	// units per microsecond = Refill*scale/Period_us (exact by construction)
	pus := uint64(lim.Period / time.Microsecond)
	hi, lo := bits.Mul64(uint64(lim.Refill), uint64(scale))
	inc, _ := bits.Div64(hi%pus, lo, pus)
	if hi >= pus {
		return bucket.MaxScaled
	}
	hi, lo = bits.Mul64(inc, uint64(ttl/time.Microsecond))
	if hi != 0 || lo > uint64(bucket.MaxScaled-full) {
		return bucket.MaxScaled
	}
	return full + int64(lo)
}

func burn(b *bucket.Bucket, held int64, ttl time.Duration, strict bool) {
	level, scale := b.Level()
	heldUnits := int64(bucket.MaxScaled)
	if held <= bucket.MaxScaled/scale {
		heldUnits = held * scale
	}
	excess := satAdd(level, heldUnits) - capUnits(b, ttl, strict)
	if excess <= 0 || level <= 0 {
		return
	}
	// Burn refill, never below zero: the excess comes from refill (the
	// potential only grows within the room under the cap), except after a
	// limit decrease, when holdings granted under the old limits may exceed
	// the new cap on their own. Taking that from the bucket as debt would
	// stop the key for as long as it takes to refill it. The burn is
	// exact, in the bucket's units: rounded up to a whole token, a cap
	// exceeded by a microsecond's refill burned a token, which for a key of
	// 5 a day is 4.8 hours of refill (its bucket fell a request behind the
	// wait it had named).
	*b = b.WithLevel(level - min(excess, level))
}

func (k *keyState) find(spender string, epoch uint64) int {
	for i := range k.holds {
		if k.holds[i].epoch == epoch && k.holds[i].spender == spender {
			return i
		}
	}
	return -1
}

// holdingFor returns the index of (spender, epoch)'s holding, adding an
// empty one expiring at now, counted against use, if there is none.
func (k *keyState) holdingFor(spender string, epoch uint64, use *usage, now bucket.Instant) int {
	if i := k.find(spender, epoch); i >= 0 {
		return i
	}
	use.leases++
	k.holds = append(k.holds, holding{spender: spender, epoch: epoch, expiry: now, use: use})
	return len(k.holds) - 1
}

// give credits a return, capped at the holding, and reports what was credited.
func give(d *dim, held *int64, n int64) int64 {
	n = min(n, *held)
	if n <= 0 || !d.on {
		return 0
	}
	*held -= n
	d.b.Give(n)
	return n
}

// charge takes a reported debt of n from d's bucket, even below zero, and
// records it as owed by the holding when it takes the level below zero.
func charge(d *dim, owed *int64, n int64) {
	if !d.on || n <= 0 {
		return
	}
	d.b.Take(n) // advanced in touch
	if level, _ := d.b.Level(); level < 0 {
		*owed = min(satAdd(*owed, n), ration.MaxAmount)
	}
}

// settleDebts forgets what holdings owe in each dimension whose level is
// back at zero or above: the refill has paid their debts.
func (k *keyState) settleDebts() {
	paid := func(d *dim) bool { level, _ := d.b.Level(); return !d.on || level >= 0 }
	for i := range k.holds {
		h := &k.holds[i]
		if h.owed.Requests != 0 && paid(&k.req) {
			h.owed.Requests = 0
		}
		if h.owed.Tokens != 0 && paid(&k.tok) {
			h.owed.Tokens = 0
		}
	}
}

func (d *dim) snapshot(free uint32) DimSnapshot {
	if !d.on {
		return DimSnapshot{}
	}
	return DimSnapshot{Limit: d.b.Limit().Capacity, Remaining: max(d.b.Tokens(), 0), Reset: d.b.TimeToFull(),
		Shared: ration.ShareUnit - free}
}

func (k *keyState) snapshot() Snapshot {
	free := k.freeShare()
	return Snapshot{Requests: k.req.snapshot(free.Requests), Tokens: k.tok.snapshot(free.Tokens)}
}

// idle reports whether the key holds no information at now: no holdings
// and every bucket full, so it can be dropped and later recreated full.
func (k *keyState) idle(now bucket.Instant) bool {
	if len(k.holds) > 0 || k.emptyFrom != 0 {
		return false
	}
	if k.req.on && k.req.b.FullAt() > now {
		return false
	}
	if k.tok.on && k.tok.b.FullAt() > now {
		return false
	}
	return true
}

func satAdd(a, b int64) int64 {
	s := a + b
	if (s > a) == (b > 0) {
		return s
	}
	if b > 0 {
		return 1<<63 - 1
	}
	return -1 << 63
}
