package lease

import (
	"math/bits"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// accrual is what an admission reads of a key's refill share to credit
// it, kept in the Key itself: most looks credit the share without a
// division and without reading the share state (see accrue). Every value
// here follows from the share state and the looks since its share began;
// accrue gives the same results as a look that divides every time.
type accrual struct {
	on     bool // the key has a share, not paused: it accrues
	looked bool // a look happened since the share began (lookNow, lookEnd)
	// known: the share state's credited is the accrual to creditedEnd,
	// and nothing more accrues before quietUntil.
	known bool
	// lookNow is the instant of the last look: another look at the same
	// instant credits nothing (a busy key looks several times a
	// microsecond). lookEnd is lookNow capped at the lease's expiry then,
	// where the fraction of a unit the share leaves over is counted
	// (keepLeft).
	lookNow, lookEnd bucket.Instant
	// creditedEnd: the accrual is credited from the share's start to here
	// (the latest look's end).
	creditedEnd bucket.Instant
	quietUntil  bucket.Instant
	rate        [2]uint64     // ration.Limits.AccrualRate of the share
	burst       ration.Amount // the share state's burst
	saturates   bucket.Instant
}

// startAccrual starts the accrual of the share just set: credited from its
// start, nothing looked at yet.
func (k *Key) startAccrual() {
	ss := k.ss
	k.acc = accrual{on: !ss.share.Zero(), creditedEnd: ss.from, rate: ss.lim.AccrualRate(ss.share), burst: ss.burst,
		saturates: bucket.Instant(1<<63 - 1)}
	max := ration.Amount{Requests: ration.MaxAmount - 1, Tokens: ration.MaxAmount - 1}
	if d, ok := ss.lim.NextAccrual(ss.share, max, ss.carried); ok {
		k.acc.saturates = ss.from.Add(d)
	}
}

// pauseShare stops the accrual while a call first sent at now carries the
// key, until its answer sets the next share.
func (k *Key) pauseShare(now bucket.Instant) {
	if ss := k.ss; ss != nil {
		ss.paused, ss.sent = true, now
		k.acc.on = false
	}
}

// endShare ends the key's share (Release): the holding is gone.
func (k *Key) endShare() {
	if k.ss != nil {
		k.keepLeft()
		k.ss.share = ration.Share{}
		k.acc.on = false
	}
}

// keepLeft fixes the fraction of a unit the share's last look left over,
// before the share changes: it is carried into the next share.
func (k *Key) keepLeft() {
	ss := k.ss
	if k.acc.looked {
		_, ss.left = ss.lim.AccruedCarry(ss.share, k.acc.lookEnd.Sub(ss.from), ss.carried)
	}
	k.acc.looked = false
}

// accrue adds k's share accrued up to now to the lease, exactly (the
// share's accrual from its start, rounded down, less what was credited
// before), and returns what it added. Accrual stops at the lease's expiry,
// while the key is in a call, and while avail + outstanding are at the
// share's burst: the excess is dropped, not banked, and accrual never takes
// avail + outstanding above the burst. Only the limited dimensions are
// kept, as everywhere in the lease.
//
// Two looks need no division: one before quietUntil, when the last exact
// look found the next unit still to come; and one whose span since the
// last credit accrues, at the share's rate rounded down, at least the room
// left below the burst, which it fills. The second is a busy key's common
// case; the first a quiet key's.
func (k *Key) accrue(now bucket.Instant) ration.Amount {
	a := &k.acc
	if !a.on || a.looked && now == a.lookNow {
		return ration.Amount{}
	}
	end := min(now, k.expiry)
	a.looked, a.lookNow, a.lookEnd = true, now, end
	if a.known && now < a.quietUntil {
		return ration.Amount{}
	}
	if now < k.expiry && end > a.creditedEnd && end < a.saturates {
		room := k.room(a.burst)
		if a.fills(room, uint64(end-a.creditedEnd)) {
			a.creditedEnd, a.known = end, false
			k.avail = k.avail.Add(room)
			return room
		}
	}
	return k.accrueExact(now, end)
}

// room is what the limited dimensions hold below burst.
func (k *Key) room(burst ration.Amount) ration.Amount {
	level := k.avail.Add(k.outstanding)
	var r ration.Amount
	if k.lim.RPM > 0 {
		r.Requests = max(0, burst.Requests-level.Requests)
	}
	if k.lim.TPM > 0 {
		r.Tokens = max(0, burst.Tokens-level.Tokens)
	}
	return r
}

// fills reports whether us microseconds at the share's rate, rounded down,
// accrue at least room in each dimension.
func (a *accrual) fills(room ration.Amount, us uint64) bool {
	for i, n := range [2]int64{room.Requests, room.Tokens} {
		if n == 0 {
			continue
		}
		hi, lo := bits.Mul64(a.rate[i], us)
		if hi>>32 == 0 && hi<<32|lo>>32 < uint64(n) {
			return false
		}
	}
	return true
}

// accrueExact is accrue's look that divides: the accrual to end, credited
// as accrue says.
func (k *Key) accrueExact(now, end bucket.Instant) ration.Amount {
	ss, a := k.ss, &k.acc
	if !a.known {
		ss.credited, _ = ss.lim.AccruedCarry(ss.share, a.creditedEnd.Sub(ss.from), ss.carried)
		a.known = true
	}
	total, _ := ss.lim.AccruedCarry(ss.share, end.Sub(ss.from), ss.carried)
	delta := total.Sub(ss.credited).Positive()
	if delta == (ration.Amount{}) {
		// Looked at faster than it accrues: skip the division until the
		// next unit.
		a.quietUntil = bucket.Instant(1<<63 - 1)
		if d, ok := ss.lim.NextAccrual(ss.share, ss.credited, ss.carried); ok {
			a.quietUntil = ss.from.Add(d)
		}
		return ration.Amount{}
	}
	ss.credited = ss.credited.Max(total)
	a.creditedEnd = max(a.creditedEnd, end)
	a.quietUntil = a.creditedEnd // nothing before it accrues anything new
	if now >= k.expiry {
		return ration.Amount{} // an expired lease is never spent
	}
	room := k.room(ss.burst)
	add := ration.Amount{Requests: min(delta.Requests, room.Requests), Tokens: min(delta.Tokens, room.Tokens)}
	k.avail = k.avail.Add(add)
	return add
}
