package allocator

import (
	"fmt"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/bucket"
	"github.com/rationhq/ration/internal/boundcheck"
)

// At saturation, spenders that renew their shares every TTL/2 and spend
// everything they accrue admit the key's rate between them, with no call
// but the renewals, and never more than the bound in any window.
func TestSharesCarryASaturatedKey(t *testing.T) {
	for _, strict := range []bool{false, true} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			const (
				n    = 4
				step = 50 * time.Millisecond
				ttl  = 10 * time.Second
				run  = 10 * time.Minute
			)
			lim := ration.Limits{RPM: 600} // C = 600, rho = 10/s
			clk := newFakeClock()
			l := newLedger(t, clk, WithTTL(ttl), WithStrict(strict))
			type spender struct {
				pool  ration.Amount
				exp   bucket.Instant
				share boundcheck.ShareView
				seq   uint64
				next  bucket.Instant
			}
			sp := make([]spender, n)
			start := ledger.InstantOf(clk.Now())
			for i := range sp {
				sp[i].next = start.Add(time.Duration(i) * ttl / (2 * n)) // staggered renewals
			}
			var perStep []int64 // admitted per step
			calls, shared := 0, false
			for now := start; now < start.Add(run); now = now.Add(step) {
				clk.Set(now.Time(time.Unix(0, 0)))
				var admitted int64
				for i := range sp {
					s := &sp[i]
					s.share.Accrue(lim, &s.pool, s.exp, now)
					if now >= s.exp {
						s.pool = ration.Amount{}
					}
					if now >= s.next {
						// Each spender asks for the whole rate: every one is refused some.
						s.seq++
						calls++
						r := acq(t, l, caller(fmt.Sprint(i), 1, s.seq), ledger.AcquireKey{Key: "k", Limits: lim,
							Want: ration.Amount{Requests: 1000}, SpendRate: ration.Amount{Requests: 600},
							Held: s.pool, Demand: ration.Amount{Requests: 300}})
						s.pool = s.pool.Add(r.Granted).Min(r.Held)
						s.exp = now.Add(ttl)
						s.share = s.share.Renewed(r.Share, r.ShareBurst, now)
						shared = shared || !r.Share.Zero()
						s.next = now.Add(ttl / 2)
					}
					admitted += s.pool.Requests // greedy: everything it holds
					s.pool.Requests = 0
				}
				perStep = append(perStep, admitted)
			}
			if !shared {
				t.Fatal("no share was granted")
			}
			// The bound over every window of whole steps: C + rho*(t + TTL), or C + rho*t strict.
			extra := ttl
			if strict {
				extra = 0
			}
			prefix := make([]int64, len(perStep)+1)
			for i, a := range perStep {
				prefix[i+1] = prefix[i] + a
			}
			for a := range perStep {
				for b := a + 1; b <= len(perStep); b++ {
					window := time.Duration(b-a-1) * step // admissions at the ends of steps a..b-1
					bound := int64(600 + (window+extra).Seconds()*10)
					if got := prefix[b] - prefix[a]; got > bound {
						t.Fatalf("window of %v admitted %d > bound %d", window, got, bound)
					}
				}
			}
			// The second half runs at the key's rate.
			half := len(perStep) / 2
			rate := float64(prefix[len(perStep)]-prefix[half]) / (time.Duration(len(perStep)-half) * step).Seconds()
			if rate < 0.99*10 {
				t.Fatalf("second half admitted %.2f/s, want at least 99%% of 10/s", rate)
			}
			if want := int(run / (ttl / 2) * n); calls > want+n {
				t.Fatalf("%d calls, want only the %d renewals", calls, want)
			}
		})
	}
}

// A limit decrease under holdings granted on the old limits (a lease and
// shares with their bursts, together above the new cap) does not put the
// key in debt: the cap burns refill, never below zero. (Burned into debt,
// the reload test under load stalled for 30 s after halving a limit.)
func TestLimitDecreaseUnderSharesIsNoDebt(t *testing.T) {
	clk := newFakeClock()
	l := newLedger(t, clk, WithTTL(10*time.Second))
	old, lower := ration.Limits{RPM: 600}, ration.Limits{RPM: 150}
	// Drain the bucket so that shares are granted, to two spenders.
	acq(t, l, caller("a", 1, 1), ledger.AcquireKey{Key: "k", Limits: old, Want: ration.Amount{Requests: 600}, Need: ration.Amount{Requests: 600}})
	clk.Advance(time.Second)
	seq := map[string]uint64{"a": 1}
	for i, who := range []string{"a", "b", "a", "b"} { // b's share comes once a renewed at its fair half
		seq[who]++
		held := ration.Amount{}
		if who == "a" {
			held.Requests = 500 // most of its first grant, unspent: above the new cap on its own
		}
		r := acq(t, l, caller(who, 1, seq[who]), ledger.AcquireKey{Key: "k", Limits: old, Held: held, Demand: ration.Amount{Requests: 600}})
		if i >= 2 && r.Share.Zero() {
			t.Fatalf("%s: no share at saturation: %+v", who, r)
		}
	}
	clk.Advance(time.Second)
	r := acq(t, l, caller("c", 1, 1), ledger.AcquireKey{Key: "k", Limits: lower})
	if r.Snapshot.Requests.Reset > time.Minute {
		t.Fatalf("after the decrease the bucket takes %v to refill, more than a minute at the new rate: it is in debt (%+v)", r.Snapshot.Requests.Reset, r)
	}
}

// What a share took from the refill stays taken when the key's holdings or
// limits change before the key is next touched: a limit change and a
// Release that does not list the key each bring it to now first. (Before,
// the bucket got the whole old rate back for the time since its last
// touch: 50 of 10 s's 100, minted.)
func TestShareRefillStaysTakenAcrossChanges(t *testing.T) {
	lim := ration.Limits{RPM: 600} // 10 a second
	for _, tc := range []struct {
		name    string
		release bool          // b releases without listing the key
		after   ration.Limits // the limits c's call carries
	}{
		{"limits raised", false, ration.Limits{RPM: 1200}},
		{"spender released without listing the key", true, lim},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			l := newLedger(t, clk, WithTTL(10*time.Second))
			acq(t, l, caller("a", 1, 1), ledger.AcquireKey{Key: "k", Limits: lim, Want: ration.Amount{Requests: 600}, Need: ration.Amount{Requests: 600}})
			r := acq(t, l, caller("b", 1, 1), ledger.AcquireKey{Key: "k", Limits: lim, Demand: ration.Amount{Requests: 6000}})
			if r.Share.Requests != ration.ShareUnit {
				t.Fatalf("b's share %+v, want the whole rate", r)
			}
			clk.Advance(5 * time.Second) // the key untouched: the share takes all 50
			if tc.release {
				if _, err := l.Release(ctx, caller("b", 1, 2), nil); err != nil {
					t.Fatal(err)
				}
			}
			r = acq(t, l, caller("c", 1, 1), ledger.AcquireKey{Key: "k", Limits: tc.after})
			if got := r.Snapshot.Requests.Remaining; got > 0 {
				t.Fatalf("the bucket holds %d after 5 s under a share of the whole rate, want 0", got)
			}
		})
	}
}

// The snapshot of an answer reports the part of the key's refill rate the
// refill shares take (what a spender falls back on without the allocator):
// the sum of the unexpired holdings' shares, and none once they expire.
func TestSnapshotReportsShared(t *testing.T) {
	clk := newFakeClock()
	const ttl = 10 * time.Second
	l := newLedger(t, clk, WithTTL(ttl))
	lim := ration.Limits{RPM: 600}
	ask := func(who string, seq uint64, demand int64) ledger.AcquireResult {
		return acq(t, l, caller(who, 1, seq), ledger.AcquireKey{Key: "k", Limits: lim,
			Want: ration.Amount{Requests: 10}, SpendRate: ration.Amount{Requests: demand}, Demand: ration.Amount{Requests: demand}})
	}
	a := ask("a", 1, 200)
	if a.Share.Zero() || a.Snapshot.Requests.Shared != a.Share.Requests {
		t.Fatalf("one spender: share %+v, snapshot shared %d; want the share reported", a.Share, a.Snapshot.Requests.Shared)
	}
	b := ask("b", 1, 100)
	if b.Share.Zero() || b.Snapshot.Requests.Shared != a.Share.Requests+b.Share.Requests {
		t.Fatalf("two spenders: shares %d + %d, snapshot shared %d; want their sum", a.Share.Requests, b.Share.Requests, b.Snapshot.Requests.Shared)
	}
	if b.Snapshot.Tokens.Shared != 0 {
		t.Fatalf("an unlimited dimension reports shared %d, want 0", b.Snapshot.Tokens.Shared)
	}
	clk.Advance(ttl + time.Second)
	if c := ask("c", 1, 0); c.Snapshot.Requests.Shared != 0 {
		t.Fatalf("after the holdings expired, snapshot shared %d, want 0", c.Snapshot.Requests.Shared)
	}
}
