package ration_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rationhq/ration"
)

func TestShareAccrued(t *testing.T) {
	perMin := ration.Limits{RPM: 6000, TPM: 90_000}
	perDay := ration.Limits{RPM: 1000, Window: 24 * time.Hour}
	quarter := ration.Share{Requests: 250_000, Tokens: 250_000}
	for _, tc := range []struct {
		name     string
		lim      ration.Limits
		s        ration.Share
		d        time.Duration
		down, up ration.Amount
	}{
		{"a quarter of 6000/min for 1 s", perMin, quarter, time.Second, ration.Amount{Requests: 25, Tokens: 375}, ration.Amount{Requests: 25, Tokens: 375}},
		{"a fraction rounds", perMin, quarter, 30 * time.Millisecond, ration.Amount{Requests: 0, Tokens: 11}, ration.Amount{Requests: 1, Tokens: 12}},
		{"whole rate", perMin, ration.Share{Requests: ration.ShareUnit}, time.Minute, ration.Amount{Requests: 6000}, ration.Amount{Requests: 6000}},
		{"per day", perDay, ration.Share{Requests: 500_000}, time.Hour, ration.Amount{Requests: 20}, ration.Amount{Requests: 21}},
		{"zero share", perMin, ration.Share{}, time.Hour, ration.Amount{}, ration.Amount{}},
		{"unlimited dimension", ration.Limits{RPM: 60}, quarter, time.Minute, ration.Amount{Requests: 15}, ration.Amount{Requests: 15}},
		{"negative time", perMin, quarter, -time.Second, ration.Amount{}, ration.Amount{}},
		{"saturates", ration.Limits{TPM: ration.MaxRate}, ration.Share{Tokens: ration.ShareUnit}, 1 << 62, ration.Amount{Tokens: ration.MaxAmount}, ration.Amount{Tokens: ration.MaxAmount}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.lim.Accrued(tc.s, tc.d, false); got != tc.down {
				t.Errorf("down: got %+v, want %+v", got, tc.down)
			}
			if got := tc.lim.Accrued(tc.s, tc.d, true); got != tc.up {
				t.Errorf("up: got %+v, want %+v", got, tc.up)
			}
		})
	}
}

func TestShareAccrualTime(t *testing.T) {
	lim := ration.Limits{RPM: 6000, TPM: 90_000}
	s := ration.Share{Requests: 250_000, Tokens: 100_000} // 25 requests/s, 150 tokens/s
	d, ok := lim.AccrualTime(s, ration.Amount{Requests: 1, Tokens: 300})
	if !ok || d != 2*time.Second {
		t.Fatalf("got %v %v, want 2s (tokens bind)", d, ok)
	}
	// The time it names is the first at which the rounded-down accrual covers the amount.
	for _, n := range []ration.Amount{{Requests: 1}, {Requests: 7, Tokens: 1}, {Tokens: 151}} {
		d, ok := lim.AccrualTime(s, n)
		if !ok {
			t.Fatalf("%+v: not ok", n)
		}
		got, before := lim.Accrued(s, d, false), lim.Accrued(s, d-time.Microsecond, false)
		if got.Requests < n.Requests || got.Tokens < n.Tokens {
			t.Errorf("%+v: after %v accrued only %+v", n, d, got)
		}
		if before.Requests >= n.Requests && before.Tokens >= n.Tokens {
			t.Errorf("%+v: %v is not the first microsecond (%+v a microsecond earlier)", n, d, before)
		}
	}
	if _, ok := lim.AccrualTime(ration.Share{Requests: 1}, ration.Amount{Tokens: 1}); ok {
		t.Error("a dimension without a share covered an amount")
	}
}

// Carrying the remainder, an accrual cut into any pieces adds up to the
// accrual of the whole span, and a renewal with another share loses no
// fraction.
func TestShareAccruedCarry(t *testing.T) {
	lim := ration.Limits{RPM: 6000, TPM: 90_000}
	s := ration.Share{Requests: 15_625, Tokens: 333_333} // 1/64 of the requests, a third of the tokens
	var sum ration.Amount
	var rem ration.Remainder
	for _, d := range []time.Duration{3 * time.Millisecond, 997 * time.Millisecond, time.Microsecond, 5*time.Second - time.Microsecond, 0, -time.Second} {
		var a ration.Amount
		a, rem = lim.AccruedCarry(s, d, rem)
		sum = sum.Add(a)
	}
	if want := lim.Accrued(s, 6*time.Second, false); sum != want {
		t.Fatalf("pieces add up to %+v, the whole span accrues %+v", sum, want)
	}
	// 1/64 of 6000/min is 1.5625/s: renewed every 0.2 s with a share that
	// alternates, a spender without the carry would get nothing.
	sum, rem = ration.Amount{}, ration.Remainder{}
	for i := range 50 {
		sh := s
		if i%2 == 1 {
			sh.Requests = 15_624
		}
		a, r := lim.AccruedCarry(sh, 200*time.Millisecond, rem)
		sum, rem = sum.Add(a), r
		if lone := lim.Accrued(sh, 200*time.Millisecond, false); lone.Requests != 0 {
			t.Fatalf("0.2 s alone accrued %d requests", lone.Requests)
		}
	}
	if sum.Requests != 15 { // 10 s × (1.5625 + 1.5624)/2 per second, rounded down
		t.Fatalf("renewed shares accrued %d requests, want 15", sum.Requests)
	}
}

// NextAccrual names the first microsecond at which the carried accrual
// exceeds a total.
func TestShareNextAccrual(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	rates := []int64{0, 1, 7, 600, 90_000, 1_000_000_000_000}
	for i := range 20_000 {
		lim := ration.Limits{RPM: rates[rng.IntN(len(rates))], TPM: rates[rng.IntN(len(rates))]}
		if i%3 == 0 {
			lim.Window = 24 * time.Hour
		}
		s := ration.Share{Requests: uint32(rng.IntN(ration.ShareUnit + 1)), Tokens: uint32(rng.IntN(ration.ShareUnit + 1))}
		div := uint64(lim.Period()/time.Microsecond) * ration.ShareUnit
		rem := ration.Remainder{Requests: rng.Uint64N(div), Tokens: rng.Uint64N(div)}
		at := time.Duration(rng.Int64N(100_000_000)) * time.Microsecond
		total, _ := lim.AccruedCarry(s, at, rem)
		d, ok := lim.NextAccrual(s, total, rem)
		if !ok {
			if lim.RPM > 0 && s.Requests > 0 || lim.TPM > 0 && s.Tokens > 0 {
				t.Fatalf("%+v %+v: no next accrual after %+v", lim, s, total)
			}
			continue
		}
		got, _ := lim.AccruedCarry(s, d, rem)
		before, _ := lim.AccruedCarry(s, d-time.Microsecond, rem)
		if got.Requests <= total.Requests && got.Tokens <= total.Tokens {
			t.Fatalf("%+v %+v: at %v accrued %+v, not past %+v", lim, s, d, got, total)
		}
		if before.Requests > total.Requests || before.Tokens > total.Tokens {
			t.Fatalf("%+v %+v: %v is not the first microsecond past %+v (%+v before)", lim, s, d, total, before)
		}
	}
}
