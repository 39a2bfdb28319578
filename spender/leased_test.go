package spender_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"connectrpc.com/connect/v2"
	"go.uber.org/goleak"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/internal/testkit"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// newAllocator returns an in-process allocator (memory-only ledger) on clk.
func newAllocator(t testing.TB, clk ration.Clock, opts ...allocator.Option) *allocator.Service {
	t.Helper()
	led, err := allocator.New(append([]allocator.Option{allocator.WithClock(clk)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { led.Close() })
	return allocator.NewService(led)
}

// newLimiter is spender.New, failing the test on an error.
var newLimiter = testkit.Limiter

// testTuning is the default lease tuning with no batching window (a key
// asks at once) and slow-path deadline slow.
func testTuning(slow time.Duration) spender.Option {
	lt := spender.DefaultLeaseTuning()
	lt.BatchWindow, lt.SlowPathDeadline = 0, slow
	return spender.WithLeaseTuning(lt)
}

// newLeased returns a leased Limiter on src, closed at the end of the test.
func newLeased(t testing.TB, clk ration.Clock, src spender.LeaseSource, opts ...spender.Option) *spender.Limiter {
	t.Helper()
	base := []spender.Option{spender.WithLeases(src), testTuning(5 * time.Second)}
	l := newLimiter(t, clk, append(base, opts...)...)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l.Close(ctx)
	})
	return l
}

// gated is a LeaseSource that holds its first call until gate is closed,
// so that the keys asked for meanwhile share the next call.
type gated struct {
	spender.LeaseSource
	gate  chan struct{}
	mu    sync.Mutex
	calls int
}

// gateFirst returns src wrapped so that its first call waits until the
// returned gated's gate is closed.
func gateFirst(src spender.LeaseSource) *gated {
	return &gated{LeaseSource: src, gate: make(chan struct{})}
}

func (g *gated) Acquire(ctx context.Context, r *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	g.mu.Lock()
	g.calls++
	first := g.calls == 1
	g.mu.Unlock()
	if first {
		<-g.gate
	}
	return g.LeaseSource.Acquire(ctx, r)
}

// simnet is a LeaseSource between a spender and the allocator that can lose
// replies (the call is applied, the answer lost) and be partitioned (the
// call never arrives). It counts calls.
type simnet struct {
	src         spender.LeaseSource
	partitioned atomic.Bool
	loseEvery   atomic.Int64 // lose every n-th reply; 0 = none
	calls       atomic.Int64 // attempts that reached the allocator
	lost        atomic.Int64
	attempts    atomic.Int64 // every attempt, partitioned or not
}

var errPartition = connect.NewError(connect.CodeUnavailable, "partitioned")

func (n *simnet) pass() error {
	n.attempts.Add(1)
	if n.partitioned.Load() {
		return errPartition
	}
	return nil
}

func (n *simnet) lose() bool {
	c := n.calls.Add(1)
	if e := n.loseEvery.Load(); e > 0 && c%e == 0 {
		n.lost.Add(1)
		return true
	}
	return false
}

func (n *simnet) Acquire(ctx context.Context, r *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	if err := n.pass(); err != nil {
		return nil, err
	}
	resp, err := n.src.Acquire(ctx, r)
	if err == nil && n.lose() {
		return nil, connect.NewError(connect.CodeUnavailable, "reply lost")
	}
	return resp, err
}

func (n *simnet) ReserveAhead(ctx context.Context, r *leasev1.ReserveAheadRequest) (*leasev1.ReserveAheadResponse, error) {
	if err := n.pass(); err != nil {
		return nil, err
	}
	resp, err := n.src.ReserveAhead(ctx, r)
	if err == nil && n.lose() {
		return nil, connect.NewError(connect.CodeUnavailable, "reply lost")
	}
	return resp, err
}

func (n *simnet) Release(ctx context.Context, r *leasev1.ReleaseRequest) (*leasev1.ReleaseResponse, error) {
	if err := n.pass(); err != nil {
		return nil, err
	}
	return n.src.Release(ctx, r)
}

// TestLeasedHandExample: with one spender and the in-process allocator the
// worked example of docs/contract.md holds to the digit: the spender asks for its
// shortfall, so the allocator's wait is the exact global one.
func TestLeasedHandExample(t *testing.T) {
	clk := fakeclock.New()
	l := newLeased(t, clk, newAllocator(t, clk))
	lim := ration.Limits{RPM: 3, TPM: 1000}

	r1 := mustReserve(t, l, "k", lim, ration.Amount{Requests: 1, Tokens: 300})
	if s := r1.Status(); s.RemainingRequests != 2 || s.RemainingTokens != 700 || s.ResetTokens != 18*time.Second {
		t.Fatalf("step 1 status = %+v, want 2 requests, 700 tokens, reset 18s", s)
	}
	r1.Settle(ration.Amount{Requests: 1, Tokens: 120})

	rej := mustReject(t, l, "k", lim, ration.Amount{Requests: 1, Tokens: 900})
	if rej.RetryAfter != 1200*time.Millisecond || spender.RetryAfterSeconds(rej.RetryAfter) != 2 {
		t.Fatalf("step 3 RetryAfter = %v, want 1.2s", rej.RetryAfter)
	}
	if rej.Status.RemainingTokens != 880 {
		t.Fatalf("step 3 remaining tokens = %d, want 880", rej.Status.RemainingTokens)
	}

	clk.Advance(1200 * time.Millisecond)
	r4 := mustReserve(t, l, "k", lim, ration.Amount{Requests: 1, Tokens: 900})
	if s := r4.Status(); s.RemainingTokens != 0 || s.RemainingRequests != 1 {
		t.Fatalf("step 4 status = %+v, want 0 tokens and 1 request left", s)
	}
}

// TestLeasedWaitModeSeedCases: wait mode on a leased Limiter goes to the
// allocator's reserve-ahead and keeps the nine wait-mode answers of docs/contract.md.
func TestLeasedWaitModeSeedCases(t *testing.T) {
	runWaitModeCases(t, func(t *testing.T, clk *fakeclock.Clock) *spender.Limiter {
		return newLeased(t, clk, newAllocator(t, clk))
	})
}

// TestLeasedHotPathStaysLocal: at steady state the allocator is called at
// most once per hundred admissions.
func TestLeasedHotPathStaysLocal(t *testing.T) {
	clk := fakeclock.New()
	n := &simnet{src: newAllocator(t, clk)}
	l := newLeased(t, clk, n)
	lim := ration.Limits{RPM: 60_000, TPM: 60_000_000} // 1000 requests a second
	admitted := 0
	for step := range 2000 { // 20 virtual seconds at 500 requests a second
		for range 5 {
			r, err := l.Reserve(ctx, "k", lim, ration.Amount{Requests: 1, Tokens: 500})
			if err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			r.Settle(ration.Amount{Requests: 1, Tokens: 300})
			admitted++
		}
		clk.Advance(10 * time.Millisecond)
		if step == 500 {
			n.calls.Store(0) // past the warm-up
			admitted = 0
		}
	}
	if ratio := float64(n.calls.Load()) / float64(admitted); ratio > 0.01 {
		t.Fatalf("%d allocator calls for %d admissions (%.4f per request), want at most 0.01", n.calls.Load(), admitted, ratio)
	}
	t.Logf("%d allocator calls for %d admissions", n.calls.Load(), admitted)
}

// bubbleClock is the clock of a test run in a synctest bubble: the system
// clock, whose time there is virtual and moves only when every goroutine in
// the bubble is blocked. A Reserve waiting for a retried call or for the
// slow-path deadline then wakes at the right virtual instant, as the
// Limiter's driver would in production, and the test waits for no real
// time.
type bubbleClock struct{ ration.SystemClock }

// Advance lets d of virtual time pass (time.Sleep inside a bubble returns
// at once in real time, after every timer due before it has fired).
func (bubbleClock) Advance(d time.Duration) { time.Sleep(d) }

// fleet drives several leased spenders on one virtual clock with traffic
// split by weights, and records every admission. It runs in a synctest
// bubble (see bubbleClock).
type fleet struct {
	t      *testing.T
	clk    bubbleClock
	ls     []*spender.Limiter
	nets   []*simnet
	lim    ration.Limits
	admits []admission
}

type admission struct {
	at   time.Duration
	cost int64
}

func newFleet(t *testing.T, n int, lim ration.Limits, allocOpts []allocator.Option, opts ...spender.Option) *fleet {
	var clk bubbleClock
	src := newAllocator(t, clk, allocOpts...)
	f := &fleet{t: t, clk: clk, lim: lim}
	for i := range n {
		nt := &simnet{src: src}
		f.nets = append(f.nets, nt)
		f.ls = append(f.ls, newLeased(t, clk, nt, append([]spender.Option{spender.WithSpenderID("gw-" + string(rune('a'+i)))}, opts...)...))
	}
	return f
}

// run offers perStep requests per step (split by weights) for steps of dt.
func (f *fleet) run(steps int, dt time.Duration, perStep int, weights []float64, cost ration.Amount) (admitted, rejected int) {
	start := f.clk.Now()
	acc := make([]float64, len(weights))
	for range steps {
		for i, w := range weights {
			acc[i] += w * float64(perStep)
			for acc[i] >= 1 {
				acc[i]--
				r, err := f.ls[i].Reserve(ctx, "shared-key", f.lim, cost)
				if err != nil {
					var rej *spender.RejectError
					if !errors.As(err, &rej) {
						f.t.Fatalf("spender %d: %v", i, err)
					}
					rejected++
					continue
				}
				r.Settle(cost)
				admitted++
				f.admits = append(f.admits, admission{at: f.clk.Now().Sub(start), cost: cost.Requests})
			}
		}
		f.clk.Advance(dt)
	}
	return admitted, rejected
}

// maxInWindow is the most admitted within any window of length w.
func (f *fleet) maxInWindow(w time.Duration) int64 {
	var best, sum int64
	j := 0
	for i := range f.admits {
		sum += f.admits[i].cost
		for f.admits[i].at-f.admits[j].at > w {
			sum -= f.admits[j].cost
			j++
		}
		best = max(best, sum)
	}
	return best
}

// TestLeasedSkewedFleetTracksTheLimit: three spenders, traffic 80/15/5 at
// twice the limit: the fleet admits at least 97% of what the limit allows
// and never more than the bound C + rho*(t + TTL) in any window.
func TestLeasedSkewedFleetTracksTheLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rpm = 6000 // 100 a second
		ttl := 2 * time.Second
		f := newFleet(t, 3, ration.Limits{RPM: rpm}, []allocator.Option{allocator.WithTTL(ttl)})
		steps, dt := 3000, 20*time.Millisecond // one virtual minute
		admitted, _ := f.run(steps, dt, 4, []float64{0.80, 0.15, 0.05}, ration.Amount{Requests: 1})
		window := time.Duration(steps) * dt
		allowed := rpm + rpm*window.Minutes() // C + rho*t
		if frac := float64(admitted) / allowed; frac < 0.97 {
			t.Fatalf("admitted %d of %.0f allowed (%.1f%%), want at least 97%%", admitted, allowed, 100*frac)
		}
		for _, w := range []time.Duration{0, 100 * time.Millisecond, time.Second, 10 * time.Second, window} {
			bound := float64(rpm) + float64(rpm)*(w+ttl).Minutes()
			if got := f.maxInWindow(w); float64(got) > bound {
				t.Fatalf("admitted %d within %v, above the bound %.0f", got, w, bound)
			}
		}
		t.Logf("admitted %d of %.0f allowed", admitted, allowed)
	})
}

// TestLeasedLostRepliesNeverDoubleGrant: with every other reply lost, the
// retried calls are answered from the allocator's record and the fleet
// still never exceeds the bound.
func TestLeasedLostRepliesNeverDoubleGrant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rpm = 600
		ttl := time.Second
		f := newFleet(t, 3, ration.Limits{RPM: rpm}, []allocator.Option{allocator.WithTTL(ttl)})
		for _, n := range f.nets {
			n.loseEvery.Store(2)
		}
		f.run(1000, 10*time.Millisecond, 3, []float64{0.5, 0.3, 0.2}, ration.Amount{Requests: 1})
		lost := int64(0)
		for _, n := range f.nets {
			lost += n.lost.Load()
		}
		if lost == 0 {
			t.Fatal("no reply was lost: the test tested nothing")
		}
		for _, w := range []time.Duration{0, time.Second, 5 * time.Second} {
			bound := float64(rpm) + float64(rpm)*(w+ttl).Minutes()
			if got := f.maxInWindow(w); float64(got) > bound {
				t.Fatalf("admitted %d within %v with %d lost replies, above the bound %.0f", got, w, lost, bound)
			}
		}
	})
}

// TestLeasedOutageFallsBackAndRecovers: during a partition a spender spends
// its valid lease, then admits at its share of the limit (limit / active
// spenders) and reports those admissions as debt when the allocator is back.
func TestLeasedOutageFallsBackAndRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rpm = 600 // 10 a second
		ttl := time.Second
		f := newFleet(t, 2, ration.Limits{RPM: rpm}, []allocator.Option{allocator.WithTTL(ttl)})
		one := ration.Amount{Requests: 1}
		f.run(500, 10*time.Millisecond, 2, []float64{0.5, 0.5}, one) // both active; leases in place

		for _, n := range f.nets {
			n.partitioned.Store(true)
		}
		// Over 30 s of outage each spender may admit its share: 300/min capacity
		// at the start plus 5 a second.
		admitted, _ := f.run(3000, 10*time.Millisecond, 2, []float64{0.5, 0.5}, one)
		share := float64(rpm/2) + float64(rpm/2)*0.5 // C/N + rho/N * 30 s, per spender
		if float64(admitted) > 2*share+2*float64(rpm) /* valid leases at the cut */ {
			t.Fatalf("admitted %d during the outage, above two shares (%.0f) plus leases", admitted, 2*share)
		}
		if float64(admitted) < 0.9*2*float64(rpm/2)*0.5 {
			t.Fatalf("admitted only %d during the outage: the share policy did not admit", admitted)
		}
		for i, l := range f.ls {
			if err := l.Ready(); !errors.Is(err, spender.ErrAllocatorUnreachable) || !strings.Contains(err.Error(), "partitioned") {
				t.Errorf("spender %d Ready during the outage: %v; want ErrAllocatorUnreachable with the last failure", i, err)
			}
		}

		for _, n := range f.nets {
			n.partitioned.Store(false)
		}
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		for _, l := range f.ls {
			if err := l.Flush(fctx); err != nil {
				t.Fatal(err)
			}
		}
		for i, l := range f.ls {
			if err := l.Ready(); err != nil {
				t.Errorf("spender %d Ready after the outage: %v", i, err)
			}
		}
		// The debt reached the allocator. The outage refilled the key's
		// global bucket by about 300 (ρ·30 s) and the fallback admissions,
		// about as many, were charged against it, so a fresh spender cannot
		// get 100 at once; without the debt it would. (A single request
		// would sit on the margin: debt and refill are equal by design.)
		fresh := newLeased(t, f.clk, f.nets[0].src)
		if _, err := fresh.Reserve(ctx, "shared-key", f.lim, ration.Amount{Requests: 100}); !errors.Is(err, spender.ErrRateLimited) {
			t.Fatalf("after recovery a fresh spender got 100 requests: %v; want a rejection (the fallback admissions were charged)", err)
		}
	})
}

// TestLeasedFailClosedAndOpen: the two other policies.
func TestLeasedFailClosedAndOpen(t *testing.T) {
	for _, tc := range []struct {
		policy spender.FallbackPolicy
		admit  bool
	}{{spender.FailClosed, false}, {spender.FailOpen, true}} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var clk bubbleClock
				n := &simnet{src: newAllocator(t, clk)}
				n.partitioned.Store(true)
				l := newLeased(t, clk, n, spender.WithFallback(tc.policy), testTuning(20*time.Millisecond))
				lim := ration.Limits{RPM: 10}
				for i := range 50 {
					_, err := l.Reserve(ctx, "k", lim, ration.Amount{Requests: 1})
					if (err == nil) != tc.admit {
						t.Fatalf("request %d under %v: %v", i, tc.policy, err)
					}
				}
			})
		})
	}
}

// TestLeasedCloseReturnsLeases: Close gives the unspent lease back, so
// another spender can use the whole budget at once; no goroutine leaks.
func TestLeasedCloseReturnsLeases(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	clk := fakeclock.New()
	src := newAllocator(t, clk)
	lim := ration.Limits{RPM: 100}
	a := newLimiter(t, clk, spender.WithLeases(src), testTuning(5*time.Second))
	mustReserve(t, a, "k", lim, ration.Amount{Requests: 1}).Settle(ration.Amount{Requests: 1})
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	b := newLimiter(t, clk, spender.WithLeases(src), testTuning(5*time.Second))
	defer b.Close(ctx)
	var wg sync.WaitGroup
	var got atomic.Int64
	for range 99 {
		wg.Go(func() {
			if _, err := b.Reserve(ctx, "k", lim, ration.Amount{Requests: 1}); err == nil {
				got.Add(1)
			}
		})
	}
	wg.Wait()
	if got.Load() != 99 {
		t.Fatalf("the second spender admitted %d of the 99 left; want all (the first returned its lease)", got.Load())
	}
	if _, err := b.Reserve(ctx, "k", lim, ration.Amount{Requests: 1}); !errors.Is(err, spender.ErrRateLimited) {
		t.Fatalf("101st request: %v, want rate limited", err)
	}
}

// TestLeasedIdleKeysAreDropped: a leased Limiter forgets keys that hold
// nothing (their leases expired or were returned and nothing is owed).
func TestLeasedIdleKeysAreDropped(t *testing.T) {
	clk := fakeclock.New()
	l := newLeased(t, clk, newAllocator(t, clk, allocator.WithTTL(time.Second)), spender.WithSweepInterval(10*time.Second), spender.WithShards(1))
	lim := ration.Limits{RPM: 600}
	for i := range 2000 {
		r := mustReserve(t, l, "key-"+strconv.Itoa(i), lim, ration.Amount{Requests: 1})
		r.Settle(ration.Amount{Requests: 1})
	}
	if l.Keys() != 2000 {
		t.Fatalf("holding %d keys, want 2000", l.Keys())
	}
	clk.Advance(2 * time.Minute)
	l.Reserve(ctx, "another", lim, ration.Amount{}) // the one shard sweeps
	if k := l.Keys(); k != 1 {
		t.Fatalf("holding %d keys two minutes after 2000 went idle", k)
	}
}

// TestLeasedIdleKeysGoWithoutTraffic: the maintenance tick sweeps, so idle
// keys are dropped even when no request touches their shard again.
func TestLeasedIdleKeysGoWithoutTraffic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clk bubbleClock
		l := newLeased(t, clk, newAllocator(t, clk, allocator.WithTTL(time.Second)), spender.WithSweepInterval(10*time.Second))
		lim := ration.Limits{RPM: 600}
		for i := range 2000 {
			mustReserve(t, l, "key-"+strconv.Itoa(i), lim, ration.Amount{Requests: 1}).Settle(ration.Amount{Requests: 1})
		}
		clk.Advance(2 * time.Minute) // no request meanwhile
		synctest.Wait()
		if k := l.Keys(); k != 0 {
			t.Fatalf("holding %d keys two idle minutes after 2000 were used, with no traffic", k)
		}
	})
}

// TestLeasedAbsurdUsageSaturates: settling absurd usage neither overflows
// nor makes the allocator refuse the next call: the debt is charged and
// the key waits it off.
func TestLeasedAbsurdUsageSaturates(t *testing.T) {
	clk := fakeclock.New()
	l := newLeased(t, clk, newAllocator(t, clk))
	lim := ration.Limits{RPM: 60, TPM: 6000}
	mustReserve(t, l, "k", lim, ration.Amount{Requests: 1, Tokens: 10}).Settle(ration.Amount{Requests: 1, Tokens: 1<<63 - 1})
	if err := l.Flush(ctx); err != nil {
		t.Fatalf("Flush after absurd usage: %v", err)
	}
	fresh := newLeased(t, clk, newAllocator(t, clk)) // another allocator: unaffected
	mustReserve(t, fresh, "k", lim, ration.Amount{Requests: 1, Tokens: 10})
	rej := mustReject(t, l, "k", lim, ration.Amount{Requests: 1, Tokens: 10})
	if rej.RetryAfter < time.Hour {
		t.Fatalf("after a debt of about 2^50 tokens the key waits %v; want a very long wait", rej.RetryAfter)
	}
}

// jitterSource delays every allocator answer by a pseudo-random latency up
// to max (virtual time, in a synctest bubble): an allocator whose commits
// linger and sometimes take longer than the slow-path deadline.
type jitterSource struct {
	spender.LeaseSource
	mu  sync.Mutex
	rng uint64
	max time.Duration
}

func (j *jitterSource) delay() {
	j.mu.Lock()
	j.rng = j.rng*6364136223846793005 + 1442695040888963407
	d := time.Duration(j.rng>>33) % j.max
	j.mu.Unlock()
	time.Sleep(d) // virtual: the bubble's clock
}

func (j *jitterSource) Acquire(ctx context.Context, r *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	j.delay()
	return j.LeaseSource.Acquire(ctx, r)
}

// TestLeasedSlowAllocatorIsNotAnOutage: a healthy allocator whose answers
// take up to 90 ms (beyond the 50 ms slow-path deadline) is slow, not
// unreachable: three spenders at half the limit for a virtual minute see no
// 429 and no fallback admission.
func TestLeasedSlowAllocatorIsNotAnOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clk bubbleClock
		src := newAllocator(t, clk)
		lim := ration.Limits{RPM: 600, TPM: 600_000} // 10 requests a second in all
		var ls []*spender.Limiter
		for i := range 3 {
			j := &jitterSource{LeaseSource: src, rng: uint64(i + 1), max: 90 * time.Millisecond}
			ls = append(ls, newLimiter(t, clk, spender.WithLeases(j), spender.WithSpenderID("gw-"+strconv.Itoa(i))))
		}
		defer func() {
			for _, l := range ls {
				l.Close(ctx)
			}
		}()
		var rejected, fallback atomic.Int64
		var wg sync.WaitGroup
		for i, l := range ls {
			wg.Go(func() {
				for n := range 100 { // one every 600 ms each: 5 a second in all
					time.Sleep(600 * time.Millisecond)
					key := "key-" + strconv.Itoa(i*1000+n%7) // fresh keys too: first requests wait for a lease
					r, err := l.Reserve(ctx, key, lim, ration.Amount{Requests: 1, Tokens: 100})
					if err != nil {
						rejected.Add(1)
						t.Logf("spender %d request %d: %v", i, n, err)
						continue
					}
					if spender.AdmissionPath(r) == spender.PathFallback {
						fallback.Add(1)
					}
					r.Settle(ration.Amount{Requests: 1, Tokens: 80})
				}
			})
		}
		wg.Wait()
		if rejected.Load() != 0 || fallback.Load() != 0 {
			t.Fatalf("a slow but healthy allocator gave %d rejections and %d fallback admissions; want none", rejected.Load(), fallback.Load())
		}
	})
}

// stallSource is an allocator that stalls now and then, as a slow fsync or
// a paused VM does: a call that arrives while it stalls waits for the
// stall's end; otherwise it answers in 1 ms. Time is the bubble's.
type stallSource struct {
	spender.LeaseSource
	start        time.Time
	every, stall time.Duration
}

// wait waits for the answer, or for ctx to end, as a network client does.
func (s *stallSource) wait(ctx context.Context) error {
	d := time.Millisecond
	if in := time.Since(s.start) % s.every; in < s.stall {
		d += s.stall - in
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return connect.NewError(connect.CodeCanceled, ctx.Err().Error())
	}
}

func (s *stallSource) Acquire(ctx context.Context, r *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	return s.LeaseSource.Acquire(ctx, r)
}

// TestLeasedStallingAllocatorIsNotAnOutage: answers in 1 ms, but an 80 ms
// stall every 2 s. After many fast answers the attempt timeout is short
// and cuts the stalled answers; a cut attempt is a slow allocator, not an
// unreachable one: 40 keys at a fraction of their limits for a virtual
// minute see no 429, no fallback admission and no switch to fallback.
func TestLeasedStallingAllocatorIsNotAnOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clk bubbleClock
		src := &stallSource{LeaseSource: newAllocator(t, clk), start: time.Now(), every: 2 * time.Second, stall: 80 * time.Millisecond}
		logs := &testkit.SyncBuffer{}
		lt := spender.DefaultLeaseTuning()
		lt.Horizon = 200 * time.Millisecond // small leases: keys ask often, and some asks meet a stall
		l := newLimiter(t, clk, spender.WithLeases(src), spender.WithSpenderID("gw"), spender.WithLeaseTuning(lt), spender.WithLogger(testLogger(logs)))
		defer l.Close(ctx)
		lim := ration.Limits{RPM: 600, TPM: 600_000}
		var rejected, fallback int
		for n := range 1200 { // 20 a second for a minute, over 40 keys: 1/20 of each key's limit
			time.Sleep(50 * time.Millisecond)
			r, err := l.Reserve(ctx, "key-"+strconv.Itoa(n%40), lim, ration.Amount{Requests: 1, Tokens: 100})
			if err != nil {
				rejected++
				t.Logf("request %d: %v", n, err)
				continue
			}
			if spender.AdmissionPath(r) == spender.PathFallback {
				fallback++
			}
			r.Settle(ration.Amount{Requests: 1, Tokens: 80})
		}
		switches := strings.Count(logs.String(), "allocator unreachable")
		if rejected != 0 || fallback != 0 || switches != 0 {
			t.Fatalf("a stalling but healthy allocator gave %d rejections, %d fallback admissions and %d switches to fallback; want none", rejected, fallback, switches)
		}
	})
}

// TestLeasedOutageFallsBackAtTheShare: a spender that held a refill share
// when the allocator went away falls back at that share, not at limit /
// active spenders. Here the busy spender of two (98% of a key offered at
// twice its rate) would be held to half the rate on the even split, while
// the idle one admits its few; at the shares the pair admits about the
// rate, and still at most capacity plus the rate times the outage.
func TestLeasedOutageFallsBackAtTheShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rpm = 600 // 10 a second
		f := newFleet(t, 2, ration.Limits{RPM: rpm}, []allocator.Option{allocator.WithTTL(time.Second)})
		one := ration.Amount{Requests: 1}
		weights := []float64{0.98, 0.02}
		f.run(600, 50*time.Millisecond, 1, weights, one) // 20 a second for 30 s: shares in place

		for _, n := range f.nets {
			n.partitioned.Store(true)
		}
		const outage = 30 * time.Second
		admitted, _ := f.run(int(outage/(50*time.Millisecond)), 50*time.Millisecond, 1, weights, one)
		rho := float64(rpm) / 60
		if even := (rho/2 + 0.02*2*rho) * outage.Seconds(); float64(admitted) < 0.85*rho*outage.Seconds() {
			t.Fatalf("admitted %d in a %v outage; want at least 85%% of the rate's %.0f (the even split admits about %.0f)",
				admitted, outage, rho*outage.Seconds(), even)
		}
		if bound := float64(rpm) + rho*outage.Seconds(); float64(admitted) > bound {
			t.Fatalf("admitted %d in a %v outage, above capacity plus the rate (%.0f)", admitted, outage, bound)
		}
	})
}

// TestLeasedOutageRetriesSlowly: through a long outage a Limiter retries
// its call with a backoff that grows to a quarter of the lease TTL (a
// second if that is less), not to a second: its fallback admits at its
// part of the key meanwhile, and a fleet's failed attempts would
// otherwise be a tenth of its calls per admission. Backoffs are jittered
// between half and the whole of it.
func TestLeasedOutageRetriesSlowly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 10 * time.Second
		f := newFleet(t, 1, ration.Limits{RPM: 600}, []allocator.Option{allocator.WithTTL(ttl)})
		one := ration.Amount{Requests: 1}
		f.run(100, 100*time.Millisecond, 1, []float64{1}, one)
		f.nets[0].partitioned.Store(true)
		before := f.nets[0].attempts.Load()
		const outage = 120 * time.Second
		f.run(int(outage/(100*time.Millisecond)), 100*time.Millisecond, 1, []float64{1}, one)
		attempts := f.nets[0].attempts.Load() - before
		// At most one attempt every ttl/8 (half the capped backoff) once it
		// is reached, plus the doublings from 10 ms on the way.
		if most := int64(outage/(ttl/8)) + 12; attempts > most {
			t.Fatalf("%d attempts in a %v outage, want at most %d (backoff up to TTL/4)", attempts, outage, most)
		}
		if attempts < int64(outage/(ttl/4)) {
			t.Fatalf("only %d attempts in a %v outage: the Limiter stopped retrying", attempts, outage)
		}
	})
}
