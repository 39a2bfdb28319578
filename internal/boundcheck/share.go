package boundcheck

import (
	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// ShareView is a spender's refill share on one key, applied by the
// spender's rules: accrual rounded down from receipt until the lease ends,
// none while a call carrying the key is in flight, never above the burst.
// The zero value is no share.
type ShareView struct {
	share    ration.Share
	burst    ration.Amount
	from     bucket.Instant
	credited ration.Amount // accrual since from already added to the pool
	paused   bool          // a call carrying the key was sent and its reply not received
	// The fraction of a unit carried in from the previous share, and the
	// one left at the last accrual (carried into the next share).
	carried, left ration.Remainder
}

// Renewed is the view of share sh with burst burst received at now,
// carrying v's fraction.
func (v *ShareView) Renewed(sh ration.Share, burst ration.Amount, now bucket.Instant) ShareView {
	return ShareView{share: sh, burst: burst, from: now, carried: v.left, left: v.left}
}

// Accrue adds the share's accrual at lim's rates up to min(now, exp) to
// pool, by the spender's rules; exp is when the lease ends.
func (v *ShareView) Accrue(lim ration.Limits, pool *ration.Amount, exp, now bucket.Instant) {
	if v.paused || v.share.Zero() {
		return
	}
	total, left := lim.AccruedCarry(v.share, min(now, exp).Sub(v.from), v.carried)
	v.left = left
	add := total.Sub(v.credited).Positive()
	v.credited = v.credited.Max(total)
	grow := func(pool *int64, add, burst int64) {
		if *pool < burst {
			*pool = min(*pool+add, burst)
		}
	}
	grow(&pool.Requests, add.Requests, v.burst.Requests)
	grow(&pool.Tokens, add.Tokens, v.burst.Tokens)
}

// heldView is what the ledger's last reply said a spender holds on a key.
type heldView struct {
	held ration.Amount
	exp  bucket.Instant
	// The share granted with the reply: the holding may grow by its
	// accrual (rounded up) from the reply, up to the burst.
	share ration.Share
	burst ration.Amount
	from  bucket.Instant
}

// limit is the most the holding can be at now by the reply's word: its held
// plus what the share may have added, and nothing once it expired. lim is
// the key's limits.
func (v *heldView) limit(lim ration.Limits, now bucket.Instant) ration.Amount {
	if v.exp <= now {
		return ration.Amount{}
	}
	if v.share.Zero() {
		return v.held
	}
	acc := lim.Accrued(v.share, now.Sub(v.from), true)
	grown := func(held, add, to int64) int64 {
		if held >= to {
			return held
		}
		return min(held+add, to)
	}
	return ration.Amount{Requests: grown(v.held.Requests, acc.Requests, v.burst.Requests), Tokens: grown(v.held.Tokens, acc.Tokens, v.burst.Tokens)}
}
