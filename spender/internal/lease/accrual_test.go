package lease

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// refAccrual is the accrual as a look that divides every time computes
// it: the definition accrue's shortcuts must agree with.
type refAccrual struct {
	share              ration.Share
	lim                ration.Limits
	burst              ration.Amount
	from, looked       bucket.Instant
	credited           ration.Amount
	carried, left      ration.Remainder
	lookedSet, paused  bool
	avail, outstanding ration.Amount
	expiry             bucket.Instant
	keyLim             ration.Limits
}

func (r *refAccrual) accrue(now bucket.Instant) ration.Amount {
	if r.paused || r.share.Zero() || r.lookedSet && now == r.looked {
		return ration.Amount{}
	}
	total, left := r.lim.AccruedCarry(r.share, min(now, r.expiry).Sub(r.from), r.carried)
	r.left, r.looked, r.lookedSet = left, now, true
	delta := total.Sub(r.credited).Positive()
	if delta == (ration.Amount{}) {
		return ration.Amount{}
	}
	r.credited = r.credited.Max(total)
	if now >= r.expiry {
		return ration.Amount{}
	}
	level := r.avail.Add(r.outstanding)
	var add ration.Amount
	if r.keyLim.RPM > 0 {
		add.Requests = min(delta.Requests, max(0, r.burst.Requests-level.Requests))
	}
	if r.keyLim.TPM > 0 {
		add.Tokens = min(delta.Tokens, max(0, r.burst.Tokens-level.Tokens))
	}
	r.avail = r.avail.Add(add)
	return add
}

func (r *refAccrual) setShare(share ration.Share, burst ration.Amount, lim ration.Limits, recv bucket.Instant) {
	r.share, r.lim, r.burst = share, lim, burst
	r.from, r.credited, r.paused, r.lookedSet = recv, ration.Amount{}, false, false
	r.carried = r.left
}

// TestAccrueAgreesWithTheExactLook drives a Key and the dividing look
// through the same random histories (shares renewed, paused and ended,
// leases spent, settled and moved, looks in and out of order, at the same
// instant, quiet and busy keys) and wants the same credit at every look
// and the same fraction carried into every share.
func TestAccrueAgreesWithTheExactLook(t *testing.T) {
	rates := []int64{0, 1, 3, 600, 10_000, 2_000_000, 1_000_000_000_000}
	ppms := []uint32{0, 1, 3_333, 250_000, ration.ShareUnit}
	for seed := range uint64(1000) {
		rng := rand.New(rand.NewPCG(seed, 11))
		pick := func(xs []int64) int64 { return xs[rng.IntN(len(xs))] }
		lim := ration.Limits{RPM: pick(rates), TPM: pick(rates)}
		if rng.IntN(4) == 0 {
			lim.Window = []time.Duration{time.Second, 24 * time.Hour}[rng.IntN(2)]
		}
		k := NewKey("k", lim, 0)
		r := &refAccrual{keyLim: lim}
		now := bucket.Instant(rng.Int64N(1000))
		setExpiry := func(e bucket.Instant) { k.expiry, r.expiry = e, e }
		setExpiry(now + bucket.Instant(rng.Int64N(20_000_000)))
		for step := range 3000 {
			switch op := rng.IntN(100); {
			case op < 3:
				share := ration.Share{Requests: ppms[rng.IntN(len(ppms))], Tokens: ppms[rng.IntN(len(ppms))]}
				burst := ration.Amount{Requests: rng.Int64N(1 + min(lim.RPM, 1<<40)), Tokens: rng.Int64N(1 + min(lim.TPM, 1<<40))}
				k.setShare(share, burst, share, false, lim, ration.Amount{}, now, now)
				r.setShare(share, burst, lim, now)
				if k.ss != nil && k.ss.carried != r.carried {
					t.Fatalf("seed %d step %d: carried %v, want %v", seed, step, k.ss.carried, r.carried)
				}
			case op < 4:
				k.pauseShare(now)
				r.paused = true
			case op < 5:
				k.endShare()
				r.share = ration.Share{}
			case op < 7:
				setExpiry(now + bucket.Instant(rng.Int64N(20_000_000)) - 1_000_000)
			case op < 8: // a lease for days: the accrual reaches MaxAmount
				setExpiry(now + bucket.Instant(rng.Int64N(1e12)))
			case op < 30:
				c := ration.Amount{Requests: rng.Int64N(3), Tokens: rng.Int64N(500)}
				c = lim.Limited(c.Min(k.avail))
				k.avail, k.outstanding = k.avail.Sub(c), k.outstanding.Add(c)
				r.avail, r.outstanding = r.avail.Sub(c), r.outstanding.Add(c)
			case op < 40:
				c := k.outstanding
				k.outstanding, r.outstanding = k.outstanding.Sub(c), r.outstanding.Sub(c)
			default:
				switch j := rng.IntN(10); {
				case j < 2: // the same instant
				case j < 3:
					now -= bucket.Instant(rng.Int64N(5)) // out of order
				case j < 8:
					now += bucket.Instant(rng.Int64N(200))
				case j < 9:
					now += bucket.Instant(rng.Int64N(5_000_000))
				default:
					now += bucket.Instant(rng.Int64N(1 << rng.IntN(40)))
				}
				got, want := k.accrue(now), r.accrue(now)
				if got != want || k.avail != r.avail {
					t.Fatalf("seed %d step %d (lim %+v share %+v): accrued %v (avail %v), want %v (avail %v)",
						seed, step, lim, r.share, got, k.avail, want, r.avail)
				}
			}
		}
	}
}
