package spender_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/spender"
)

// none marks a request refused in wait mode (the contract's "not in time").
const none = -1

// TestWaitModeSeedCases runs the nine wait-mode cases of docs/contract.md against ReserveAt:
// "send now, at t, or not in time". A bucket of capacity c refilled one
// token every e seconds is Limits{RPM: 60/e, BurstRequests: c}.
func TestWaitModeSeedCases(t *testing.T) {
	runWaitModeCases(t, func(t *testing.T, clk *fakeclock.Clock) *spender.Limiter { return newLimiter(t, clk) })
}

// runWaitModeCases runs the wait-mode cases on Limiters made by newLimiter.
func runWaitModeCases(t *testing.T, newLimiter func(*testing.T, *fakeclock.Clock) *spender.Limiter) {
	zeros := func(n int) []int64 { return make([]int64, n) }
	steps := func(from, to, step int64) []int64 {
		var out []int64
		for v := from; v <= to; v += step {
			out = append(out, v)
		}
		return out
	}
	nones := func(n int) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = none
		}
		return out
	}
	cat := func(parts ...[]int64) []int64 {
		var out []int64
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	at := func(n int, v int64) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = v
		}
		return out
	}
	for i, tc := range []struct {
		requests []int64 // seconds, non-decreasing
		capacity int64
		every    int64 // seconds per token
		maxWait  int64 // seconds
		want     []int64
	}{
		{[]int64{0, 0, 0, 0}, 2, 2, 60, []int64{0, 0, 2, 4}},
		{[]int64{0, 0, 0, 10}, 2, 2, 60, []int64{0, 0, 2, 10}},
		{[]int64{0, 0, 0, 1}, 2, 2, 1, []int64{0, 0, none, 2}},
		{zeros(80), 10, 2, 300, cat(zeros(10), steps(2, 140, 2))},
		{zeros(80), 10, 2, 60, cat(zeros(10), steps(2, 60, 2), nones(40))},
		{cat(zeros(10), at(12, 100)), 10, 2, 60, cat(zeros(10), at(10, 100), []int64{102, 104})},
		{[]int64{0, 0, 2}, 2, 2, 0, []int64{0, 0, 2}},
		{[]int64{0, 2, 4, 6, 8}, 1, 2, 0, []int64{0, 2, 4, 6, 8}},
		{nil, 10, 2, 60, nil},
	} {
		t.Run(fmt.Sprint(i+1), func(t *testing.T) {
			clk := fakeclock.New()
			l := newLimiter(t, clk)
			lim := ration.Limits{RPM: 60 / tc.every, BurstRequests: tc.capacity}
			got := make([]int64, 0, len(tc.requests))
			for _, sec := range tc.requests {
				clk.Set(fakeclock.Epoch().Add(time.Duration(sec) * time.Second))
				_, when, err := l.ReserveAt(ctx, "vendor-key", lim, ration.Amount{Requests: 1}, time.Duration(tc.maxWait)*time.Second)
				switch {
				case err == nil:
					d := when.Sub(fakeclock.Epoch())
					if d%time.Second != 0 {
						t.Fatalf("send time %v is not a whole second", d)
					}
					got = append(got, int64(d/time.Second))
				case errors.Is(err, spender.ErrRateLimited):
					got = append(got, none)
				default:
					t.Fatalf("ReserveAt: %v", err)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got  %v\nwant %v", got, tc.want)
			}
		})
	}
}

// TestWaitModeRefusalReservesNothing: a refused caller's RetryAfter is the
// wait it would have needed, and the next caller is not delayed by it.
func TestWaitModeRefusalReservesNothing(t *testing.T) {
	clk := fakeclock.New()
	l := newLimiter(t, clk)
	lim := ration.Limits{TPM: 60} // one token a second
	if _, when, err := l.ReserveAt(ctx, "k", lim, ration.Amount{Tokens: 60}, 0); err != nil || !when.Equal(clk.Now()) {
		t.Fatalf("first = %v, %v; want now", when, err)
	}
	_, _, err := l.ReserveAt(ctx, "k", lim, ration.Amount{Tokens: 30}, 10*time.Second)
	var rej *spender.RejectError
	if !errors.As(err, &rej) || rej.RetryAfter != 30*time.Second {
		t.Fatalf("second = %v, want a refusal with RetryAfter 30s", err)
	}
	_, when, err := l.ReserveAt(ctx, "k", lim, ration.Amount{Tokens: 5}, 10*time.Second)
	if err != nil || when.Sub(clk.Now()) != 5*time.Second {
		t.Fatalf("third = %v, %v; want 5s from now (the refusal reserved nothing)", when, err)
	}
	// Reserve (now mode) sees the wait-mode debt.
	if _, err := l.Reserve(ctx, "k", lim, ration.Amount{Tokens: 1}); !errors.As(err, &rej) || rej.RetryAfter != 6*time.Second {
		t.Fatalf("Reserve after a reservation ahead = %v, want RetryAfter 6s", err)
	}
}
