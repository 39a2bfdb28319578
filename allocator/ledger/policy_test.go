package ledger

import (
	"math/big"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
	"pgregory.net/rapid"
)

// TestRatePerMatchesBigInt: ratePer is ceil(rate × h / minute), capped at
// MaxAmount, whether the product fits 64 bits (a plain division) or not
// (a 128-bit one).
func TestRatePerMatchesBigInt(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rate := rapid.OneOf(rapid.Int64Range(-1, 1000), rapid.Int64Range(0, ration.MaxRate), rapid.Int64Range(0, 1<<62)).Draw(t, "rate")
		h := time.Duration(rapid.OneOf(rapid.Int64Range(-1, int64(time.Second)), rapid.Int64Range(0, int64(time.Hour)), rapid.Int64Range(0, 1<<62)).Draw(t, "h"))
		want := int64(0)
		if rate > 0 && h > 0 {
			p := new(big.Int).Mul(big.NewInt(rate), big.NewInt(int64(h)))
			q, r := new(big.Int).QuoRem(p, big.NewInt(int64(time.Minute)), new(big.Int))
			if r.Sign() != 0 {
				q.Add(q, big.NewInt(1))
			}
			want = ration.MaxAmount
			if q.Cmp(big.NewInt(ration.MaxAmount)) < 0 {
				want = q.Int64()
			}
		}
		if got := ratePer(rate, h); got != want {
			t.Fatalf("ratePer(%d, %v) = %d, want %d", rate, h, got, want)
		}
	})
}

func TestSharePolicies(t *testing.T) {
	const u = ration.ShareUnit
	for _, tc := range []struct {
		name        string
		demand      uint32
		demands     []uint32
		free        uint32
		maxMin, pro uint32
	}{
		{"demands fit: each gets its own", u / 10, []uint32{u / 10, u / 5, u / 4}, u, u / 10, u / 10},
		{"overload: equal split", u, []uint32{u, u, u, u}, u, u / 4, u / 4},
		{"overload: a small demand is met, the rest split", u / 10, []uint32{u / 10, u, u}, u, u / 10, u / 21},
		{"overload: the large ones share what is left", u, []uint32{u / 10, u, u}, u, 9 * u / 20, 10 * u / 21},
		{"held by others: no more than is free", u / 2, []uint32{u / 2, u / 2}, u / 5, u / 5, u / 5},
		{"alone", u / 3, []uint32{u / 3}, u, u / 3, u / 3},
		// Demands above the whole rate count as they are: a gateway offered
		// 4× the rate beside two offered half of it each takes 4/5 of the
		// proportional split, not the 1/2 that capping every demand at the
		// rate gave it.
		{"overload beyond the rate: the busy one", 4 * u, []uint32{4 * u, u / 2, u / 2}, u, u / 3, 4 * u / 5},
		{"overload beyond the rate: a quiet one", u / 2, []uint32{4 * u, u / 2, u / 2}, u, u / 3, u / 10},
		{"demands at the cap", MaxShareDemand, []uint32{MaxShareDemand, MaxShareDemand}, u, u / 2, u / 2},
		{"no demand", 0, []uint32{0, u}, u, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := ShareDemand{Demand: tc.demand, Demands: tc.demands}
			if got := min((MaxMinShare{}).Share(d), tc.free); got != tc.maxMin {
				t.Errorf("max-min: got %d, want %d", got, tc.maxMin)
			}
			if got := min((ProportionalShare{}).Share(d), tc.free); got != tc.pro {
				t.Errorf("proportional: got %d, want %d", got, tc.pro)
			}
		})
	}
	// Headroom raises each demand, and the split with it.
	d := ShareDemand{Demand: 400_000, Demands: []uint32{400_000, 400_000}}
	if got := (MaxMinShare{Headroom: ration.ShareUnit / 8}).Share(d); got != 450_000 {
		t.Errorf("headroom: got %d, want 450000", got)
	}
	d.Demands = []uint32{400_000, 800_000}
	if got := (MaxMinShare{Headroom: ration.ShareUnit / 8}).Share(d); got != 450_000 {
		t.Errorf("headroom under overload: got %d, want 450000 (the small demand is met)", got)
	}
}

// A share granted on other limits counts at its spender's rate: what it
// accrues there, as a fraction of the current limits, rounded up.
func TestShareOfOtherLimits(t *testing.T) {
	old := ration.Limits{RPM: 600, TPM: 6000, BurstRequests: 50}
	h := holding{}
	h.setShare(ration.Share{Requests: 250_000, Tokens: 100_000}, old, ration.Amount{Requests: 10, Tokens: 10}, 0)
	for _, tc := range []struct {
		name string
		lim  ration.Limits
		want ration.Share
	}{
		{"same rates, other burst", ration.Limits{RPM: 600, TPM: 6000}, ration.Share{Requests: 250_000, Tokens: 100_000}},
		{"halved", ration.Limits{RPM: 300, TPM: 3000}, ration.Share{Requests: 500_000, Tokens: 200_000}},
		{"doubled", ration.Limits{RPM: 1200, TPM: 12000}, ration.Share{Requests: 125_000, Tokens: 50_000}},
		{"rounded up", ration.Limits{RPM: 700, TPM: 6000}, ration.Share{Requests: 214_286, Tokens: 100_000}},
		{"at most the whole rate", ration.Limits{RPM: 100, TPM: 6000}, ration.Share{Requests: ration.ShareUnit, Tokens: 100_000}},
		{"per hour", ration.Limits{RPM: 36_000, TPM: 360_000, Window: time.Hour}, ration.Share{Requests: 250_000, Tokens: 100_000}},
		{"now unlimited", ration.Limits{TPM: 6000}, ration.Share{Tokens: 100_000}},
	} {
		if got := h.shareOf(tc.lim); got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// demandShare counts a demand above the key's rate as it is, up to
// MaxShareDemand, rounding up.
func TestDemandShare(t *testing.T) {
	lim := bucket.Limit{Capacity: 6000, Refill: 6000, Period: time.Minute} // 6000 a minute
	for _, tc := range []struct {
		perMinute int64
		want      uint32
	}{
		{0, 0},
		{-5, 0},
		{1, 167}, // 1/6000 of the rate, rounded up
		{3000, ration.ShareUnit / 2},
		{6000, ration.ShareUnit},
		{24000, 4 * ration.ShareUnit},
		{6000 * 1000, MaxShareDemand},
		{6000*1000 + 1, MaxShareDemand},
		{ration.MaxAmount, MaxShareDemand},
	} {
		if got := demandShare(tc.perMinute, lim); got != tc.want {
			t.Errorf("demandShare(%d a minute) = %d, want %d", tc.perMinute, got, tc.want)
		}
	}
}
