package spender_test

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/spender"
)

// perDay is 1440 requests a day: a day's budget at once, then one a minute.
var perDay = ration.Limits{RPM: 1440, Window: 24 * time.Hour}

// TestPerDayWindow: a limit per day holds a day's budget and refills it
// over the day, exactly, with headers in the same terms.
func TestPerDayWindow(t *testing.T) {
	clk := fakeclock.New()
	l := newLimiter(t, clk)
	one := ration.Amount{Requests: 1}
	var last spender.Reservation
	for range 1440 {
		last = mustReserve(t, l, "k", perDay, one)
	}
	if st := last.Status(); st.LimitRequests != 1440 || st.RemainingRequests != 0 || st.ResetRequests != 24*time.Hour {
		t.Errorf("Status after a day's budget: %+v; want limit 1440, 0 left, full again in 24h", st)
	}
	if rej := mustReject(t, l, "k", perDay, one); rej.RetryAfter != time.Minute {
		t.Fatalf("RetryAfter %v; want 1m (a day's 1440 refill one a minute)", rej.RetryAfter)
	}
	clk.Advance(time.Minute)
	mustReserve(t, l, "k", perDay, one)
	mustReject(t, l, "k", perDay, one)
}

// TestLeasedPerDayWindow: the same limit through the allocator: the window
// travels with the limits, and two gateways share a day's budget: over
// three minutes of demand far above it they admit the day's 1440 plus the
// three refilled since, never more, and are told to come back in about a
// minute, not a second.
func TestLeasedPerDayWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clk bubbleClock
		alloc := newAllocator(t, clk)
		var ls []*spender.Limiter
		for _, id := range []string{"gw-a", "gw-b"} {
			ls = append(ls, newLeased(t, clk, alloc, spender.WithSpenderID(id)))
		}
		one := ration.Amount{Requests: 1}
		admitted := 0
		for i := range 18_000 { // 100 a second for 3 minutes
			r, err := ls[i%2].Reserve(ctx, "k", perDay, one)
			var rej *spender.RejectError
			switch {
			case err == nil:
				admitted++
				r.Settle(one)
			case errors.As(err, &rej):
				if rej.RetryAfter > time.Minute {
					t.Fatalf("request %d: %v; want a wait of at most a minute", i, err)
				}
			default:
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if admitted > 1443 || admitted < 1400 {
			t.Errorf("admitted %d in 3 minutes; want the day's 1440 plus up to 3 refilled (at least 1400)", admitted)
		}
	})
}
