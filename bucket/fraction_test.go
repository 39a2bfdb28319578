package bucket

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestAdvanceFraction(t *testing.T) {
	lim := Limit{Capacity: 100, Refill: 60, Period: time.Minute} // 1 token/s
	for _, tc := range []struct {
		name     string
		num, den uint64
		after    time.Duration
		want     int64 // whole tokens from empty
	}{
		{"a quarter for 4 s", 1, 4, 4 * time.Second, 1},
		{"a quarter for 3.9 s", 1, 4, 3900 * time.Millisecond, 0},
		{"three quarters for 4 s", 3, 4, 4 * time.Second, 3},
		{"nothing", 0, 4, time.Hour, 0},
		{"the whole rate", 4, 4, 4 * time.Second, 4},
		{"capped at capacity", 1, 2, time.Hour, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := FromState(lim, State{Level: 0, Last: 0})
			b.AdvanceFraction(Instant(tc.after/time.Microsecond), tc.num, tc.den)
			if got := b.Tokens(); got != tc.want {
				t.Errorf("got %d tokens, want %d", got, tc.want)
			}
		})
	}
}

// A bucket refilled at a fraction never holds more than the exact fraction
// of the refill, however the time is cut, and WaitFraction names the first
// microsecond it covers a cost when advanced in one step.
func TestFractionIsExactOrShort(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		lim := Limit{Capacity: 1 + rng.Int64N(10_000), Refill: 1 + rng.Int64N(100_000), Period: time.Duration(1+rng.Int64N(120)) * time.Second}
		if lim.Validate() != nil {
			continue
		}
		den := uint64(1_000_000)
		num := rng.Uint64N(den + 1)
		b, _ := FromState(lim, State{Level: 0, Last: 0})
		exact, _ := FromState(lim, State{Level: 0, Last: 0})
		now := Instant(0)
		for range 1 + rng.IntN(20) {
			now += Instant(rng.Int64N(5_000_000))
			b.AdvanceFraction(now, num, den)
		}
		exact.AdvanceFraction(now, num, den)
		if b.level > exact.level {
			t.Fatalf("%+v at %d/%d: stepped level %d above the one-step %d", lim, num, den, b.level, exact.level)
		}
		full, _ := FromState(lim, State{Level: 0, Last: 0})
		full.Advance(now)
		if exact.level > full.level {
			t.Fatalf("%+v at %d/%d: level %d above the whole rate's %d", lim, num, den, exact.level, full.level)
		}
		n := 1 + rng.Int64N(lim.Capacity)
		w := exact.WaitFraction(n, num, den)
		if num == 0 {
			if w != InfDuration && !exact.Covers(n) {
				t.Fatalf("no refill, wait %v", w)
			}
			continue
		}
		at := exact
		at.AdvanceFraction(now+Instant(w/time.Microsecond), num, den)
		if !at.Covers(n) {
			t.Fatalf("%+v at %d/%d: %d not covered after WaitFraction %v", lim, num, den, n, w)
		}
		if w > 0 {
			before := exact
			before.AdvanceFraction(now+Instant(w/time.Microsecond)-1, num, den)
			if before.Covers(n) {
				t.Fatalf("%+v at %d/%d: %d covered a microsecond before WaitFraction %v", lim, num, den, n, w)
			}
		}
	}
}
