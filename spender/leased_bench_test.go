package spender_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// The leased benchmarks run the Limiter on leases from an in-process
// allocator on the real clock, beside the standalone Limiter in the same
// run, and report allocator calls per admitted request.
//
//	go test -run '^$' -bench 'Leased|ReserveSettle/ration' -benchmem -count 5 ./spender

// countingSource counts calls that reach the allocator.
type countingSource struct {
	spender.LeaseSource
	calls atomic.Int64
}

func (c *countingSource) Acquire(ctx context.Context, r *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	c.calls.Add(1)
	return c.LeaseSource.Acquire(ctx, r)
}

var leasedBenchLimits = ration.Limits{RPM: 1_000_000_000_000, TPM: 1_000_000_000_000}

func newBenchAllocator(b *testing.B) *countingSource {
	led, err := allocator.New()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { led.Close() })
	return &countingSource{LeaseSource: allocator.NewService(led)}
}

// stubSource grants whatever is asked for, with no state and no refill
// share: an allocator that costs nothing, to separate the leased Limiter's
// own cost from the in-process allocator's (its work on refreshes and its
// heap, which the GC marks too) and from a share's accrual on every
// admission. It is not a target measurement.
type stubSource struct{}

func (stubSource) Acquire(ctx context.Context, r *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	out := &leasev1.AcquireResponse{LeaseTtlUs: int64(10 * time.Second / time.Microsecond), Keys: make([]*leasev1.KeyGrant, len(r.GetKeys()))}
	for i, k := range r.GetKeys() {
		want, need := k.GetWant(), k.GetNeed()
		out.Keys[i] = &leasev1.KeyGrant{Status: leasev1.GrantStatus_GRANT_STATUS_OK, ActiveSpenders: 1,
			Granted: &leasev1.Amount{Requests: max(want.GetRequests(), need.GetRequests()), Tokens: max(want.GetTokens(), need.GetTokens())}}
	}
	return out, nil
}

func (stubSource) ReserveAhead(ctx context.Context, r *leasev1.ReserveAheadRequest) (*leasev1.ReserveAheadResponse, error) {
	return nil, errors.New("stub: no reserve-ahead")
}

func (stubSource) Release(ctx context.Context, r *leasev1.ReleaseRequest) (*leasev1.ReleaseResponse, error) {
	return &leasev1.ReleaseResponse{Returned: make([]*leasev1.Amount, len(r.GetKeys()))}, nil
}

// shareStubSource is stubSource granting every key a whole refill share,
// so that every admission accrues one, as on the allocator's leases.
type shareStubSource struct{ stubSource }

func (s shareStubSource) Acquire(ctx context.Context, r *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	out, err := s.stubSource.Acquire(ctx, r)
	for _, g := range out.GetKeys() {
		g.Share = &leasev1.Share{RequestsPpm: ration.ShareUnit, TokensPpm: ration.ShareUnit}
		g.ShareBurst = &leasev1.Amount{Requests: leasedBenchLimits.RPM, Tokens: leasedBenchLimits.TPM}
	}
	return out, err
}

func benchLeased(b *testing.B, keys []string) {
	benchLeasedOn(b, newBenchAllocator(b), keys)
}

func benchLeasedOn(b *testing.B, src *countingSource, keys []string) {
	l := newLimiter(b, ration.SystemClock{}, spender.WithLeases(src))
	defer l.Close(context.Background())
	c := ration.Amount{Requests: 1, Tokens: 300}
	used := ration.Amount{Requests: 1, Tokens: 120}
	// Warm up with the same round-robin traffic for a second, so every
	// key's spend rate is known and its lease sized for it.
	for i, start := 0, time.Now(); time.Since(start) < time.Second; i++ {
		r, err := l.Reserve(ctx, keys[i%len(keys)], leasedBenchLimits, c)
		if err != nil {
			b.Fatal(err)
		}
		r.Settle(used)
	}
	src.calls.Store(0)
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for i := 0; b.Loop(); i++ {
		r, err := l.Reserve(ctx, keys[i%len(keys)], leasedBenchLimits, c)
		if err != nil {
			b.Fatal(err)
		}
		r.Settle(used)
		n++
	}
	b.ReportMetric(float64(src.calls.Load())/float64(n), "calls/op")
}

func BenchmarkLeasedReserveSettle(b *testing.B) {
	b.Run("leased/1key", func(b *testing.B) { benchLeased(b, benchKeys(1)) })
	b.Run("standalone/1key", func(b *testing.B) { benchOurs(b, benchKeys(1)) })
	b.Run("leased/10kkeys", func(b *testing.B) { benchLeased(b, benchKeys(10_000)) })
	b.Run("standalone/10kkeys", func(b *testing.B) { benchOurs(b, benchKeys(10_000)) })
	b.Run("leased-stub/10kkeys", func(b *testing.B) {
		benchLeasedOn(b, &countingSource{LeaseSource: stubSource{}}, benchKeys(10_000))
	})
	b.Run("leased-stub-share/10kkeys", func(b *testing.B) {
		benchLeasedOn(b, &countingSource{LeaseSource: shareStubSource{}}, benchKeys(10_000))
	})
	// The same 10k keys in random order (eight shuffled rounds, repeated):
	// in turn, keys are visited in the order their states were allocated,
	// which the hardware prefetcher follows; a gateway sees them in no
	// such order.
	b.Run("leased/10kkeys-random", func(b *testing.B) { benchLeased(b, shuffledKeys(10_000)) })
	b.Run("standalone/10kkeys-random", func(b *testing.B) { benchOurs(b, shuffledKeys(10_000)) })
}

// shuffledKeys returns n keys in eight random orders, one after another
// (the same on every run).
func shuffledKeys(n int) []string {
	keys := benchKeys(n)
	r := rand.New(rand.NewPCG(7, 7))
	out := make([]string, 0, 8*n)
	for range 8 {
		for _, i := range r.Perm(n) {
			out = append(out, keys[i])
		}
	}
	return out
}

// BenchmarkLeasedSlowPath measures a request that finds no lease: a new
// key each time, so every Reserve waits for an Acquire. "inprocess" calls
// the in-process allocator (the floor of the slow path); "loopback" is the
// production shape: the connect client (DialAllocator, Connect protocol,
// bearer token) to the allocator served over h2c on 127.0.0.1, one request
// at a time, so ns/op is the latency a request on the slow path sees.
// Both allocators are memory-only (for the durable commit's share, see
// the allocator's benchmarks).
func BenchmarkLeasedSlowPath(b *testing.B) {
	lim := ration.Limits{RPM: 600, TPM: 60_000}
	run := func(b *testing.B, src spender.LeaseSource) {
		l := newLimiter(b, ration.SystemClock{}, spender.WithLeases(src), testTuning(50*time.Millisecond))
		defer l.Close(context.Background())
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			r, err := l.Reserve(ctx, "slow-"+strconv.Itoa(i), lim, ration.Amount{Requests: 1, Tokens: 300})
			if err != nil {
				b.Fatal(err)
			}
			r.Settle(ration.Amount{Requests: 1, Tokens: 300})
		}
	}
	b.Run("inprocess", func(b *testing.B) { run(b, newBenchAllocator(b)) })
	b.Run("loopback", func(b *testing.B) {
		led, err := allocator.New()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { led.Close() })
		base := serveService(b, allocator.NewService(led), "bench-token")
		src, err := spender.DialAllocator(base, spender.WithToken("bench-token"))
		if err != nil {
			b.Fatal(err)
		}
		run(b, src)
	})
}
