package spender_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/spender"
)

var ctx = context.Background()

// mustReserve reserves c or fails the test.
func mustReserve(t *testing.T, l *spender.Limiter, key string, lim ration.Limits, c ration.Amount) spender.Reservation {
	t.Helper()
	r, err := l.Reserve(ctx, key, lim, c)
	if err != nil {
		t.Fatalf("Reserve(%q, %+v, %+v): %v", key, lim, c, err)
	}
	return r
}

// mustReject expects a *RejectError and returns it.
func mustReject(t *testing.T, l *spender.Limiter, key string, lim ration.Limits, c ration.Amount) *spender.RejectError {
	t.Helper()
	r, err := l.Reserve(ctx, key, lim, c)
	var rej *spender.RejectError
	if !errors.As(err, &rej) {
		t.Fatalf("Reserve(%q, %+v, %+v) = %v, %v; want a *RejectError", key, lim, c, r, err)
	}
	return rej
}

// TestHandExample is the worked example of docs/contract.md, every number.
func TestHandExample(t *testing.T) {
	clk := fakeclock.New()
	l := newLimiter(t, clk)
	lim := ration.Limits{RPM: 3, TPM: 1000}

	// 1. Reserve 300 tokens (prompt 60 + max_tokens 240).
	r1 := mustReserve(t, l, "k", lim, ration.Amount{Requests: 1, Tokens: 300})
	want := spender.Status{LimitRequests: 3, RemainingRequests: 2, LimitTokens: 1000, RemainingTokens: 700,
		ResetTokens: 18 * time.Second, ResetRequests: 20 * time.Second}
	if got := r1.Status(); got != want {
		t.Fatalf("step 1 status = %+v, want %+v", got, want)
	}

	// 2. It used 120: the refund of 180 brings the token bucket to 880.
	r1.Settle(ration.Amount{Requests: 1, Tokens: 120})

	// 3. Still at t=0, 900 tokens: 880 < 900, wait (900-880)*60/1000 = 1.2 s.
	rej := mustReject(t, l, "k", lim, ration.Amount{Requests: 1, Tokens: 900})
	if rej.RetryAfter != 1200*time.Millisecond {
		t.Errorf("step 3 RetryAfter = %v, want 1.2s", rej.RetryAfter)
	}
	if got := spender.RetryAfterSeconds(rej.RetryAfter); got != 2 {
		t.Errorf("step 3 Retry-After = %d, want 2", got)
	}
	if rej.Status.RemainingTokens != 880 || rej.Dimension != spender.Tokens || rej.Oversize {
		t.Errorf("step 3 rejection = %+v, want remaining tokens 880 on the token budget", rej)
	}
	if !errors.Is(rej, spender.ErrRateLimited) {
		t.Errorf("step 3 rejection does not match ErrRateLimited")
	}

	// 4. At t=1.2 s the token bucket holds exactly 900: admitted, leaving 0;
	// the request bucket refilled 0.06 to 2.06 and keeps 1.06.
	clk.Advance(1200 * time.Millisecond)
	r4 := mustReserve(t, l, "k", lim, ration.Amount{Requests: 1, Tokens: 900})
	s := r4.Status()
	if s.RemainingTokens != 0 || s.RemainingRequests != 1 {
		t.Errorf("step 4 status = %+v, want remaining tokens 0 and requests 1", s)
	}
	if s.ResetTokens != 60*time.Second {
		t.Errorf("step 4 reset tokens = %v, want 1m0s", s.ResetTokens)
	}
}

// TestBurstThenRefill: 60 at once, the 61st waits 1 s, one per second
// after, and 10 idle minutes bank only 60.
func TestBurstThenRefill(t *testing.T) {
	clk := fakeclock.New()
	l := newLimiter(t, clk)
	lim := ration.Limits{RPM: 60}
	one := ration.Amount{Requests: 1}
	for i := range 60 {
		if _, err := l.Reserve(ctx, "k", lim, one); err != nil {
			t.Fatalf("request %d of the burst: %v", i+1, err)
		}
	}
	if rej := mustReject(t, l, "k", lim, one); rej.RetryAfter != time.Second {
		t.Fatalf("61st RetryAfter = %v, want 1s", rej.RetryAfter)
	}
	for i := range 5 {
		clk.Advance(999 * time.Millisecond)
		if rej := mustReject(t, l, "k", lim, one); rej.RetryAfter != time.Millisecond {
			t.Fatalf("second %d: RetryAfter at 999ms = %v, want 1ms", i, rej.RetryAfter)
		}
		clk.Advance(time.Millisecond)
		mustReserve(t, l, "k", lim, one)
		mustReject(t, l, "k", lim, one)
	}
	clk.Advance(10 * time.Minute)
	admitted := 0
	for {
		if _, err := l.Reserve(ctx, "k", lim, one); err != nil {
			break
		}
		admitted++
	}
	if admitted != 60 {
		t.Fatalf("after 10 idle minutes admitted %d at once, want 60", admitted)
	}
}

// TestSettleChargesOverrun: reserve 100, use 700: the next 10 tokens wait
// 11 s. At TPM 600 (10 tokens a second) the full bucket goes 600 -> 500 at
// the reservation and to -100 at settlement; 10 tokens are covered after
// (10 - (-100)) / 10 = 11 s.
func TestSettleChargesOverrun(t *testing.T) {
	clk := fakeclock.New()
	l := newLimiter(t, clk)
	lim := ration.Limits{TPM: 600}
	r := mustReserve(t, l, "k", lim, ration.Amount{Tokens: 100})
	r.Settle(ration.Amount{Tokens: 700})
	rej := mustReject(t, l, "k", lim, ration.Amount{Tokens: 10})
	if rej.RetryAfter != 11*time.Second {
		t.Fatalf("RetryAfter = %v, want 11s", rej.RetryAfter)
	}
	if rej.Status.RemainingTokens != 0 || rej.Status.ResetTokens != 70*time.Second {
		t.Fatalf("status = %+v, want 0 remaining and 70s to full", rej.Status)
	}
	clk.Advance(11 * time.Second)
	mustReserve(t, l, "k", lim, ration.Amount{Tokens: 10})

	// A long response: the bucket refilled to full before the overrun is
	// known. The refill is counted first and capped, then the overrun is
	// charged: 600 - 600 = 0, so 10 tokens wait 1 s.
	r = mustReserve(t, l, "long", lim, ration.Amount{Tokens: 100})
	clk.Advance(time.Minute)
	r.Settle(ration.Amount{Tokens: 700})
	if rej := mustReject(t, l, "long", lim, ration.Amount{Tokens: 10}); rej.RetryAfter != time.Second {
		t.Fatalf("after a long response RetryAfter = %v, want 1s", rej.RetryAfter)
	}
}

// TestCancelAndSettleOnce: cancel returns everything; a second cancel and a
// cancel after settle do nothing.
func TestCancelAndSettleOnce(t *testing.T) {
	clk := fakeclock.New()
	l := newLimiter(t, clk)
	lim := ration.Limits{RPM: 10, TPM: 1000}
	c := ration.Amount{Requests: 1, Tokens: 400}
	remaining := func() spender.Status {
		t.Helper()
		r := mustReserve(t, l, "k", lim, ration.Amount{})
		return r.Status()
	}

	r := mustReserve(t, l, "k", lim, c)
	r.Cancel()
	if s := remaining(); s.RemainingTokens != 1000 || s.RemainingRequests != 10 {
		t.Fatalf("after cancel: %+v, want everything back", s)
	}
	r.Cancel()
	r.Settle(ration.Amount{Requests: 1, Tokens: 0})
	if s := remaining(); s.RemainingTokens != 1000 || s.RemainingRequests != 10 {
		t.Fatalf("a second cancel or a settle after cancel changed the level: %+v", s)
	}

	r = mustReserve(t, l, "k", lim, c)
	r.Settle(ration.Amount{Requests: 1, Tokens: 100})
	r.Cancel()
	r.Settle(ration.Amount{Requests: 0, Tokens: 0})
	if s := remaining(); s.RemainingTokens != 900 || s.RemainingRequests != 9 {
		t.Fatalf("after settle then cancel: %+v, want 900 tokens and 9 requests", s)
	}
}

// TestZeroMeansUnlimited: limits of 0 never reject.
func TestZeroMeansUnlimited(t *testing.T) {
	l := newLimiter(t, fakeclock.New())
	for _, lim := range []ration.Limits{{}, {RPM: 0, TPM: 0, BurstTokens: 5}} {
		for range 10000 {
			r := mustReserve(t, l, "k", lim, ration.Amount{Requests: 1, Tokens: 1 << 40})
			if s := r.Status(); s != (spender.Status{}) {
				t.Fatalf("unlimited status = %+v, want zero", s)
			}
			r.Settle(ration.Amount{Requests: 1, Tokens: 1 << 50})
		}
	}
	// One dimension unlimited: only the other one counts.
	lim := ration.Limits{RPM: 2}
	for range 2 {
		mustReserve(t, l, "half", lim, ration.Amount{Requests: 1, Tokens: 1 << 40})
	}
	if rej := mustReject(t, l, "half", lim, ration.Amount{Requests: 1}); rej.Dimension != spender.Requests {
		t.Fatalf("rejected on %v, want requests", rej.Dimension)
	}
	lim = ration.Limits{TPM: 100}
	for range 1000 {
		r := mustReserve(t, l, "tok", lim, ration.Amount{Requests: 1, Tokens: 0})
		if s := r.Status(); s.LimitRequests != 0 || s.LimitTokens != 100 {
			t.Fatalf("status = %+v, want only the token dimension", s)
		}
	}
}

// TestOversizeCostRejected: 1001 tokens against TPM 1000 is rejected even
// when the bucket is full; 1000 fits.
func TestOversizeCostRejected(t *testing.T) {
	l := newLimiter(t, fakeclock.New())
	lim := ration.Limits{RPM: 10, TPM: 1000}
	rej := mustReject(t, l, "k", lim, ration.Amount{Requests: 1, Tokens: 1001})
	if !rej.Oversize || rej.RetryAfter != 0 || rej.Dimension != spender.Tokens {
		t.Fatalf("rejection = %+v, want Oversize on tokens with no RetryAfter", rej)
	}
	if !errors.Is(rej, spender.ErrExceedsCapacity) || errors.Is(rej, spender.ErrRateLimited) {
		t.Fatalf("oversize rejection matches the wrong sentinel: %v", rej)
	}
	if rej.Status.RemainingTokens != 1000 {
		t.Fatalf("oversize rejection reserved something: %+v", rej.Status)
	}
	mustReserve(t, l, "k", lim, ration.Amount{Requests: 1, Tokens: 1000})
	if rej := mustReject(t, l, "k", lim, ration.Amount{Requests: 11}); !rej.Oversize || rej.Dimension != spender.Requests {
		t.Fatalf("11 requests against RPM 10: %+v, want Oversize on requests", rej)
	}
	// Wait mode refuses it too, whatever the max wait.
	if _, _, err := l.ReserveAt(ctx, "k", lim, ration.Amount{Tokens: 1001}, time.Hour); !errors.Is(err, spender.ErrExceedsCapacity) {
		t.Fatalf("ReserveAt oversize = %v, want ErrExceedsCapacity", err)
	}
}

// TestKeysAreIndependent: key a exhausted, key b untouched.
func TestKeysAreIndependent(t *testing.T) {
	l := newLimiter(t, fakeclock.New())
	lim := ration.Limits{RPM: 5, TPM: 500}
	for range 5 {
		mustReserve(t, l, "a", lim, ration.Amount{Requests: 1, Tokens: 100})
	}
	mustReject(t, l, "a", lim, ration.Amount{Requests: 1, Tokens: 1})
	r := mustReserve(t, l, "b", lim, ration.Amount{Requests: 1, Tokens: 100})
	if s := r.Status(); s.RemainingRequests != 4 || s.RemainingTokens != 400 {
		t.Fatalf("key b status = %+v, want 4 requests and 400 tokens left", s)
	}
}

// TestConcurrentReserve: 1000 goroutines against RPM 100 admit exactly 100.
func TestConcurrentReserve(t *testing.T) {
	l := newLimiter(t, fakeclock.New())
	lim := ration.Limits{RPM: 100, TPM: 1_000_000}
	var admitted, rejected atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 1000 {
		wg.Go(func() {
			<-start
			_, err := l.Reserve(ctx, "k", lim, ration.Amount{Requests: 1, Tokens: 10})
			switch {
			case err == nil:
				admitted.Add(1)
			case errors.Is(err, spender.ErrRateLimited):
				rejected.Add(1)
			default:
				t.Errorf("Reserve: %v", err)
			}
		})
	}
	close(start)
	wg.Wait()
	if admitted.Load() != 100 || rejected.Load() != 900 {
		t.Fatalf("admitted %d, rejected %d; want exactly 100 and 900", admitted.Load(), rejected.Load())
	}
}

// TestRetryAfterSeconds: whole seconds, rounded up, at least 1.
func TestRetryAfterSeconds(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int
	}{
		{0, 1},
		{-time.Second, 1},
		{time.Millisecond, 1},
		{time.Second, 1},
		{1200 * time.Millisecond, 2},
		{59 * time.Second, 59},
		{59*time.Second + time.Millisecond, 60},
		{time.Duration(1<<63 - 1), 1<<31 - 1},
	} {
		if got := spender.RetryAfterSeconds(tc.d); got != tc.want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}
