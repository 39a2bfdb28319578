package spender_test

import (
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/spender"
)

// TestReservationStatusIsAdmissionTime: a Reservation's Status is the
// key's status right after it was admitted, computed only when asked; it
// does not move when the key is spent again, refilled, settled or has its
// limits edited afterwards. Standalone and leased.
func TestReservationStatusIsAdmissionTime(t *testing.T) {
	lim := ration.Limits{RPM: 3, TPM: 1000}
	edited := ration.Limits{RPM: 6, TPM: 2000}
	c := ration.Amount{Requests: 1, Tokens: 300}
	for _, tc := range []struct {
		name string
		make func(t *testing.T, clk *fakeclock.Clock) *spender.Limiter
	}{
		{"standalone", func(t *testing.T, clk *fakeclock.Clock) *spender.Limiter { return newLimiter(t, clk) }},
		{"leased", func(t *testing.T, clk *fakeclock.Clock) *spender.Limiter {
			return newLeased(t, clk, newAllocator(t, clk))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := fakeclock.New()
			l := tc.make(t, clk)
			r1, err := l.Reserve(ctx, "k", lim, c)
			if err != nil {
				t.Fatal(err)
			}
			want := r1.Status()
			// The worked example, first request: 2 requests and 700 tokens left,
			// tokens full again in 18 s, requests in 20 s.
			if want.RemainingRequests != 2 || want.RemainingTokens != 700 || want.LimitTokens != 1000 ||
				want.ResetTokens != 18*time.Second || want.ResetRequests != 20*time.Second {
				t.Fatalf("first status %+v", want)
			}
			r2, err := l.Reserve(ctx, "k", lim, c)
			if err != nil {
				t.Fatal(err)
			}
			if s := r2.Status(); s.RemainingRequests != 1 || s.RemainingTokens != 400 {
				t.Fatalf("second status %+v", s)
			}
			clk.Advance(5 * time.Second)
			r2.Settle(ration.Amount{Requests: 1, Tokens: 100})
			if _, err := l.Reserve(ctx, "k", edited, c); err != nil {
				t.Fatal(err)
			}
			if got := r1.Status(); got != want {
				t.Fatalf("status moved after later activity: %+v, want %+v", got, want)
			}
			r1.Settle(c)
			if got := r1.Status(); got != want {
				t.Fatalf("status moved after settle: %+v, want %+v", got, want)
			}
		})
	}
}
