package boundcheck

import (
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// checkReturn checks a credited return against the ledger's last word on
// spender s's holding on key k in epoch, then records the new holding
// (held, until exp, growing by share sh up to burst from now).
func (m *Model) checkReturn(s *Spender, epoch uint64, k int, credited, held ration.Amount, exp bucket.Instant, sh ration.Share, burst ration.Amount) {
	v := &s.viewOf(epoch)[k]
	limit := v.limit(m.keys[k].Limits, m.Now())
	if credited.Requests > limit.Requests || credited.Tokens > limit.Tokens {
		m.t.Fatalf("spender %s key %d: credited return %+v exceeds holding %+v", s.id, k, credited, limit)
	}
	v.held = held
	v.exp = max(v.exp, exp)
	v.share, v.burst, v.from = sh, burst, m.Now()
}

// Check verifies the bound for every key, dimension and window ending
// now: what spenders admitted in the window (from their pools, reserved
// ahead, overruns) plus what they could still admit now is at most
// C + rho*(t + TTL), or C + rho*t in strict mode, plus the debt reported.
// The windows start at now and at each admission.
func (m *Model) Check() {
	now := m.Now()
	for k, pk := range m.keys {
		for d := 0; d < 2; d++ {
			lim, on := pk.Limits.RequestLimit()
			pick := func(a ration.Amount) int64 { return a.Requests }
			if d == 1 {
				lim, on = pk.Limits.TokenLimit()
				pick = func(a ration.Amount) int64 { return a.Tokens }
			}
			if !on {
				continue
			}
			var usable int64
			for _, s := range m.spenders {
				if s.exp[k] > now {
					usable += pick(s.pool[k])
				}
			}
			pus := int64(lim.Period / time.Microsecond)
			extra := int64(TTL / time.Microsecond)
			if m.strict {
				extra = 0
			}
			debt := pick(m.debt[k])
			starts := []bucket.Instant{now}
			for _, a := range m.adm {
				starts = append(starts, a.at)
			}
			for _, a0 := range starts {
				var admitted int64
				for _, a := range m.adm {
					if a.key == k && a.at >= a0 {
						admitted += pick(a.amt)
					}
				}
				lhs := (admitted + usable) * pus
				rhs := (lim.Capacity+debt)*pus + lim.Refill*(int64(now-a0)+extra)
				if lhs > rhs {
					m.t.Fatalf("bound broken on key %s dim %d: window [%d, %d] admitted %d + usable %d > C %d + rho*(t%s) + debt %d (strict=%v)",
						pk.Name, d, a0, now, admitted, usable, lim.Capacity, map[bool]string{false: "+TTL", true: ""}[m.strict], debt, m.strict)
				}
			}
		}
	}
}
