package spender_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender"
)

// The benchmarks compare our two-dimension Reserve+Settle with
// x/time/rate's single-bucket ReserveN followed by Cancel, the same
// reserve-then-adjust shape, both on the real clock. Limits are high so
// that every call is admitted: this measures the admission path, not
// rejection.
//
//	go test -run '^$' -bench . -benchmem -count 5 ./spender

var benchLimits = ration.Limits{RPM: ration.MaxRate, TPM: ration.MaxRate}

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "sk-bench-" + strconv.Itoa(i)
	}
	return keys
}

func benchOurs(b *testing.B, keys []string) {
	l := newLimiter(b, ration.SystemClock{})
	c := ration.Amount{Requests: 1, Tokens: 300}
	used := ration.Amount{Requests: 1, Tokens: 120}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		r, err := l.Reserve(ctx, keys[i%len(keys)], benchLimits, c)
		if err != nil {
			b.Fatal(err)
		}
		r.Settle(used)
	}
}

func benchRate(b *testing.B, n int) {
	lims := make([]*rate.Limiter, n)
	for i := range lims {
		lims[i] = rate.NewLimiter(rate.Limit(1<<40), 1<<40)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		r := lims[i%n].ReserveN(time.Now(), 300)
		if !r.OK() {
			b.Fatal("not ok")
		}
		r.Cancel()
	}
}

// benchRateKeyed is x/time/rate as a gateway would use it for many keys:
// the limiter found by key in a map under a read lock.
func benchRateKeyed(b *testing.B, keys []string) {
	var mu sync.RWMutex
	lims := make(map[string]*rate.Limiter, len(keys))
	for _, k := range keys {
		lims[k] = rate.NewLimiter(rate.Limit(1<<40), 1<<40)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		mu.RLock()
		lim := lims[keys[i%len(keys)]]
		mu.RUnlock()
		r := lim.ReserveN(time.Now(), 300)
		if !r.OK() {
			b.Fatal("not ok")
		}
		r.Cancel()
	}
}

func BenchmarkReserveSettle(b *testing.B) {
	b.Run("ration/1key", func(b *testing.B) { benchOurs(b, benchKeys(1)) })
	b.Run("xrate/1key", func(b *testing.B) { benchRate(b, 1) })
	b.Run("ration/10kkeys", func(b *testing.B) { benchOurs(b, benchKeys(10_000)) })
	b.Run("xrate/10kkeys", func(b *testing.B) { benchRate(b, 10_000) })
	b.Run("xrate-keyed/10kkeys", func(b *testing.B) { benchRateKeyed(b, benchKeys(10_000)) })
}

// BenchmarkReserveSettleParallel runs Reserve+Settle from GOMAXPROCS
// goroutines over 10k keys; x/time/rate gets one limiter per key too.
// Compare ns/op across -cpu 1,2 to see the scaling.
func BenchmarkReserveSettleParallel(b *testing.B) {
	keys := benchKeys(10_000)
	b.Run("ration", func(b *testing.B) {
		l := newLimiter(b, ration.SystemClock{})
		c := ration.Amount{Requests: 1, Tokens: 300}
		used := ration.Amount{Requests: 1, Tokens: 120}
		var next atomic.Uint64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := next.Add(7919)
			for pb.Next() {
				i++
				r, err := l.Reserve(ctx, keys[i%uint64(len(keys))], benchLimits, c)
				if err != nil {
					b.Error(err)
					return
				}
				r.Settle(used)
			}
		})
	})
	b.Run("xrate-keyed", func(b *testing.B) {
		var mu sync.RWMutex
		lims := make(map[string]*rate.Limiter, len(keys))
		for _, k := range keys {
			lims[k] = rate.NewLimiter(rate.Limit(1<<40), 1<<40)
		}
		var next atomic.Uint64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := next.Add(7919)
			for pb.Next() {
				i++
				mu.RLock()
				lim := lims[keys[i%uint64(len(keys))]]
				mu.RUnlock()
				r := lim.ReserveN(time.Now(), 300)
				r.Cancel()
			}
		})
	})
	b.Run("xrate", func(b *testing.B) {
		lims := make([]*rate.Limiter, len(keys))
		for i := range lims {
			lims[i] = rate.NewLimiter(rate.Limit(1<<40), 1<<40)
		}
		var next atomic.Uint64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := next.Add(7919)
			for pb.Next() {
				i++
				r := lims[i%uint64(len(lims))].ReserveN(time.Now(), 300)
				r.Cancel()
			}
		})
	})
}

// BenchmarkReserveAll is a request charged to 1 and to 3 budgets (its key,
// its team, its model's engine-wide cap) with ReserveAll and
// Reservations.Settle, standalone and leased (the in-process allocator,
// warmed up as in BenchmarkLeasedReserveSettle), over 10k keys sharing 100
// teams and 4 models: about as many budget states as keys, as in the
// one-budget benchmarks. Compare with BenchmarkReserveSettle and BenchmarkLeasedReserveSettle
// in the same run; the bar: 3 budgets within 3x of 1.
//
//	go test -run '^$' -bench 'ReserveAll|ReserveSettle/(ration|xrate)/10kkeys|LeasedReserveSettle/leased/10kkeys$' -benchmem -count 5 ./spender
func BenchmarkReserveAll(b *testing.B) {
	keys := benchKeys(10_000)
	for _, leased := range []bool{false, true} {
		mode, lim := "standalone", benchLimits
		if leased {
			mode, lim = "leased", leasedBenchLimits
		}
		for _, n := range []int{1, 3} {
			b.Run(fmt.Sprintf("%s/%dbudgets", mode, n), func(b *testing.B) {
				charges := make([][]spender.Charge, len(keys))
				actual := make([][]ration.Amount, len(keys))
				c, used := ration.Amount{Requests: 1, Tokens: 300}, ration.Amount{Requests: 1, Tokens: 120}
				for i, k := range keys {
					charges[i] = []spender.Charge{
						{Key: k, Limits: lim, Cost: c},
						{Key: "team:" + strconv.Itoa(i%100), Limits: lim, Cost: c},
						{Key: "model:" + strconv.Itoa(i%4), Limits: lim, Cost: c},
					}[:n]
					actual[i] = []ration.Amount{used, used, used}[:n]
				}
				l := newLimiter(b, ration.SystemClock{})
				var src *countingSource
				if leased {
					src = newBenchAllocator(b)
					l = newLimiter(b, ration.SystemClock{}, spender.WithLeases(src))
					defer l.Close(context.Background())
				}
				run := func(i int) {
					rs, err := l.ReserveAll(ctx, charges[i%len(keys)])
					if err != nil {
						b.Fatal(err)
					}
					if err := rs.Settle(actual[i%len(keys)]); err != nil {
						b.Fatal(err)
					}
				}
				if leased {
					for i, start := 0, time.Now(); time.Since(start) < time.Second; i++ {
						run(i) // spend rates known, leases sized
					}
					src.calls.Store(0)
				}
				b.ReportAllocs()
				b.ResetTimer()
				n := 0
				for i := 0; b.Loop(); i++ {
					run(i)
					n++
				}
				if src != nil {
					b.ReportMetric(float64(src.calls.Load())/float64(n), "calls/op")
				}
			})
		}
	}
}
