package bucket

import (
	"math/big"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// genLimit draws a limit with a small capacity and a rate that may be
// awkward (a prime per minute) so the fixed-point scale is exercised.
func genLimit(t *rapid.T) Limit {
	return Limit{
		Capacity: rapid.Int64Range(1, 50).Draw(t, "capacity"),
		Refill:   rapid.SampledFrom([]int64{1, 7, 30, 60, 97, 1000}).Draw(t, "refill"),
		Period:   rapid.SampledFrom([]time.Duration{time.Second, time.Minute, 7 * time.Millisecond}).Draw(t, "period"),
	}
}

// boundHolds checks that the cost of events in every window [a, b] is at
// most capacity + rate*(b-a+slack), exactly: cost*Period <=
// Capacity*Period + Refill*(b-a+slack), all in microseconds.
func boundHolds(t *rapid.T, lim Limit, at []Instant, cost []int64, slack int64) {
	idx := make([]int, len(at))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return at[idx[a]] < at[idx[b]] })
	prefix := make([]int64, len(idx)+1)
	for i, k := range idx {
		prefix[i+1] = prefix[i] + cost[k]
	}
	p := int64(lim.Period / time.Microsecond)
	for i := range idx {
		if i > 0 && at[idx[i-1]] == at[idx[i]] {
			continue // windows start at the first event of an instant
		}
		for k := i; k < len(idx); k++ {
			if k+1 < len(idx) && at[idx[k+1]] == at[idx[k]] {
				continue // and end at the last event of an instant
			}
			sum := prefix[k+1] - prefix[i]
			window := int64(at[idx[k]]-at[idx[i]]) + slack
			if sum*p > lim.Capacity*p+lim.Refill*window {
				t.Fatalf("window [%d, %d] µs admitted %d > capacity %d + rate*%dµs (limit %+v)",
					at[idx[i]], at[idx[k]], sum, lim.Capacity, window, lim)
			}
		}
	}
}

// TestPropertyBoundTakeNow: whatever the arrivals, the tokens taken minus
// the tokens given back within any window of length t never exceed
// capacity + rate*t (the bucket's bound).
func TestPropertyBoundTakeNow(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		lim := genLimit(t)
		b, _ := New(lim, 0)
		now := Instant(0)
		var at []Instant
		var cost []int64
		for range rapid.IntRange(1, 60).Draw(t, "ops") {
			now += Instant(rapid.Int64Range(0, 3_000_000).Draw(t, "dt"))
			n := rapid.Int64Range(0, lim.Capacity+2).Draw(t, "n")
			if _, ok := b.TakeNow(now, n); ok {
				at, cost = append(at, now), append(cost, n)
				if rapid.Bool().Draw(t, "refund") {
					r := rapid.Int64Range(0, n).Draw(t, "refundN")
					b.Give(r)
					at, cost = append(at, now), append(cost, -r)
				}
			}
			if b.Tokens() < 0 {
				t.Fatalf("TakeNow left a negative level %d", b.Tokens())
			}
		}
		boundHolds(t, lim, at, cost, 0)
	})
}

// TestPropertyBoundReserveAhead: in wait mode the requests sent (at the
// time each was told) within any window of length t cost at most
// capacity + rate*t. The times told are the exact ones rounded up to the
// microsecond, so two of them can stand up to 1 µs closer than the exact
// schedule: the bound holds with t widened by that 1 µs.
func TestPropertyBoundReserveAhead(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		lim := genLimit(t)
		b, _ := New(lim, 0)
		now := Instant(0)
		var at []Instant
		var cost []int64
		maxWait := time.Duration(rapid.Int64Range(0, int64(10*time.Minute)).Draw(t, "maxWait"))
		for range rapid.IntRange(1, 60).Draw(t, "ops") {
			now += Instant(rapid.Int64Range(0, 2_000_000).Draw(t, "dt"))
			n := rapid.Int64Range(0, lim.Capacity).Draw(t, "n")
			if w, ok := b.ReserveAhead(now, n, maxWait); ok {
				if w > maxWait {
					t.Fatalf("granted a wait %v above maxWait %v", w, maxWait)
				}
				at, cost = append(at, now.Add(w)), append(cost, n)
			}
		}
		boundHolds(t, lim, at, cost, 1)
	})
}

// model is the reference bucket in exact rational arithmetic: the level in
// tokens and the rate in tokens per microsecond.
type model struct {
	lim   Limit
	level *big.Rat
	rate  *big.Rat
	last  Instant
}

func newModel(lim Limit, now Instant) *model {
	return &model{lim: lim, level: new(big.Rat).SetInt64(lim.Capacity),
		rate: big.NewRat(lim.Refill, int64(lim.Period/time.Microsecond)), last: now}
}

func (m *model) advance(now Instant) {
	if now <= m.last {
		return
	}
	add := new(big.Rat).Mul(m.rate, new(big.Rat).SetInt64(int64(now-m.last)))
	m.level.Add(m.level, add)
	if capacity := new(big.Rat).SetInt64(m.lim.Capacity); m.level.Cmp(capacity) > 0 {
		m.level = capacity
	}
	m.last = now
}

// wait returns ceil((n - level)/rate) microseconds, or 0.
func (m *model) wait(n int64) int64 {
	d := new(big.Rat).Sub(new(big.Rat).SetInt64(n), m.level)
	if d.Sign() <= 0 {
		return 0
	}
	d.Quo(d, m.rate)
	q, r := new(big.Int).QuoRem(d.Num(), d.Denom(), new(big.Int))
	if r.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}

// TestReferenceModelNoDrift runs a long random mix of every operation on
// one bucket and on the rational model, and requires them to agree exactly
// after every step: no drift after hundreds of thousands of operations.
func TestReferenceModelNoDrift(t *testing.T) {
	ops := 300_000
	if testing.Short() {
		ops = 30_000
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, lim := range []Limit{PerMinute(1000), PerMinute(999_983), {Capacity: 37, Refill: 7, Period: time.Minute}, {Capacity: 10, Refill: 3, Period: 7 * time.Millisecond}} {
		b, _ := New(lim, 0)
		m := newModel(lim, 0)
		now := Instant(0)
		for i := range ops / 4 {
			now += Instant(rng.Int64N(int64(lim.Period/time.Microsecond) / 10))
			n := rng.Int64N(lim.Capacity + 1)
			switch rng.IntN(5) {
			case 0, 1: // take now
				b.Advance(now)
				m.advance(now)
				w := m.wait(n)
				gw, ok := b.TakeNow(now, n)
				if ok != (w == 0) || (!ok && gw != time.Duration(w)*time.Microsecond) {
					t.Fatalf("%+v op %d: TakeNow(%d) = %v, %v; model wait %dµs", lim, i, n, gw, ok, w)
				}
				if ok {
					m.level.Sub(m.level, new(big.Rat).SetInt64(n))
				}
			case 2: // give
				b.Give(n)
				m.level.Add(m.level, new(big.Rat).SetInt64(n))
				if capacity := new(big.Rat).SetInt64(lim.Capacity); m.level.Cmp(capacity) > 0 {
					m.level = capacity
				}
			case 3: // charge
				b.Charge(now, n)
				m.advance(now)
				m.level.Sub(m.level, new(big.Rat).SetInt64(n))
			case 4: // reserve ahead, at most one period
				m.advance(now)
				w := m.wait(n)
				gw, ok := b.ReserveAhead(now, n, lim.Period)
				if ok != (time.Duration(w)*time.Microsecond <= lim.Period) || gw != time.Duration(w)*time.Microsecond {
					t.Fatalf("%+v op %d: ReserveAhead(%d) = %v, %v; model wait %dµs", lim, i, n, gw, ok, w)
				}
				if ok {
					m.level.Sub(m.level, new(big.Rat).SetInt64(n))
				}
			}
			units, scale := b.Level()
			if got := big.NewRat(units, scale); got.Cmp(m.level) != 0 {
				t.Fatalf("%+v op %d: level %v, model %v", lim, i, got.FloatString(9), m.level.FloatString(9))
			}
		}
	}
}
