package lease

import (
	"math/bits"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// accrual is a key's refill share as an admission credits it: the whole
// units credited so far and the fraction of a unit left over, kept in
// fixed point the way bucket.Bucket keeps its level, so that a look
// multiplies where the exact formula (ration.Limits.AccruedCarry of the
// whole span) divides. Every value follows from the share state and the
// looks since its share began: accrue credits what the exact formula
// does, look for look (TestAccrueAgreesWithTheExactLook).
type accrual struct {
	on     bool // the key has a share, not paused: it accrues
	looked bool // a look happened since the share began (lookNow, lookEnd)
	// lookNow is the instant of the last look: another look at the same
	// instant credits nothing (a busy key looks several times a
	// microsecond). lookEnd is lookNow capped at the lease's expiry then,
	// where the fraction of a unit the share leaves over is counted
	// (keepLeft).
	lookNow, lookEnd bucket.Instant
	// end is where the accrual is credited to (the latest look's end);
	// credited is the whole units from the share's start to end, frac the
	// fraction left over in units of 1/den, per dimension.
	end      bucket.Instant
	credited ration.Amount
	frac     [2]uint64
	// Per microsecond the share adds whole[i] + part[i]/den units; inv is
	// ⌊(2^64−1)/den⌋, to divide by den with a multiplication; a span of
	// more than maxSpan microseconds (or past saturates, where the
	// accrual may reach MaxAmount) takes the exact formula.
	whole, part [2]uint64
	den, inv    uint64
	maxSpan     uint64
	saturates   bucket.Instant
	burst       ration.Amount // the share state's burst
}

// startAccrual starts the accrual of the share just set: nothing credited
// from its start, the fraction the last share left carried in.
func (k *Key) startAccrual() {
	ss := k.ss
	a := accrual{on: !ss.share.Zero(), end: ss.from, frac: [2]uint64{ss.carried.Requests, ss.carried.Tokens}, burst: ss.burst,
		saturates: bucket.Instant(1<<63 - 1)}
	a.den = uint64(ss.lim.Period()/time.Microsecond) * ration.ShareUnit
	a.inv = ^uint64(0) / a.den
	var most uint64
	for i, x := range [2]struct {
		rate int64
		ppm  uint32
	}{{ss.lim.RPM, ss.share.Requests}, {ss.lim.TPM, ss.share.Tokens}} {
		if x.rate > 0 && x.ppm > 0 {
			m := uint64(x.rate) * uint64(x.ppm)
			a.whole[i], a.part[i] = m/a.den, m%a.den
			most = max(most, a.part[i])
		}
	}
	a.maxSpan = 1<<63 - 1
	if most > 0 {
		a.maxSpan = (^uint64(0) - a.den) / most
	}
	max := ration.Amount{Requests: ration.MaxAmount - 1, Tokens: ration.MaxAmount - 1}
	if d, ok := ss.lim.NextAccrual(ss.share, max, ss.carried); ok {
		a.saturates = ss.from.Add(d)
	}
	ss.acc = a
}

// pauseShare stops the accrual while a call first sent at now carries the
// key, until its answer sets the next share.
func (k *Key) pauseShare(now bucket.Instant) {
	if ss := k.ss; ss != nil {
		ss.paused, ss.sent = true, now
		ss.acc.on = false
	}
}

// endShare ends the key's share (Release): the holding is gone.
func (k *Key) endShare() {
	if k.ss != nil {
		k.keepLeft()
		k.ss.share = ration.Share{}
		k.ss.acc.on = false
	}
}

// keepLeft fixes the fraction of a unit the share's last look left over,
// before the share changes: it is carried into the next share.
func (k *Key) keepLeft() {
	ss := k.ss
	a := &ss.acc
	switch {
	case !a.looked:
	case a.lookEnd == a.end:
		ss.left = ration.Remainder{Requests: a.frac[0], Tokens: a.frac[1]}
	default:
		_, ss.left = ss.lim.AccruedCarry(ss.share, a.lookEnd.Sub(ss.from), ss.carried)
	}
	a.looked = false
}

// accrue adds k's share accrued up to now to the lease, exactly (the
// share's accrual from its start, rounded down, less what was credited
// before), and returns what it added. Accrual stops at the lease's expiry,
// while the key is in a call, and while avail + outstanding are at the
// share's burst: the excess is dropped, not banked, and accrual never takes
// avail + outstanding above the burst. Only the limited dimensions are
// kept, as everywhere in the lease.
func (k *Key) accrue(now bucket.Instant) ration.Amount {
	ss := k.ss
	if ss == nil {
		return ration.Amount{}
	}
	a := &ss.acc
	if !a.on || a.looked && now == a.lookNow {
		return ration.Amount{}
	}
	end := min(now, k.expiry)
	a.looked, a.lookNow, a.lookEnd = true, now, end
	if end <= a.end {
		return ration.Amount{} // credited already
	}
	var delta ration.Amount
	if span := uint64(end - a.end); span <= a.maxSpan && end < a.saturates {
		delta = ration.Amount{Requests: a.step(0, span), Tokens: a.step(1, span)}
	} else {
		total, left := ss.lim.AccruedCarry(ss.share, end.Sub(ss.from), ss.carried)
		delta = total.Sub(a.credited)
		a.frac = [2]uint64{left.Requests, left.Tokens}
	}
	a.end, a.credited = end, a.credited.Add(delta)
	if delta == (ration.Amount{}) || now >= k.expiry {
		return ration.Amount{} // an expired lease is never spent
	}
	level := k.avail.Add(k.outstanding)
	var add ration.Amount
	if k.lim.RPM > 0 {
		add.Requests = min(delta.Requests, max(0, a.burst.Requests-level.Requests))
	}
	if k.lim.TPM > 0 {
		add.Tokens = min(delta.Tokens, max(0, a.burst.Tokens-level.Tokens))
	}
	k.avail = k.avail.Add(add)
	return add
}

// step moves dimension i's accrual on by span microseconds (at most
// maxSpan) and returns the whole units it added.
func (a *accrual) step(i int, span uint64) int64 {
	x := a.frac[i] + a.part[i]*span // < den + maxSpan × part: no overflow
	q, _ := bits.Mul64(x, a.inv)    // ⌊x/den⌋ or up to two less
	r := x - q*a.den
	for r >= a.den {
		q, r = q+1, r-a.den
	}
	a.frac[i] = r
	return int64(a.whole[i]*span + q)
}
