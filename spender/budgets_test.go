package spender_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/spender"
)

// charge is one Charge of one request and Tokens tokens.
func charge(key string, lim ration.Limits, tokens int64) spender.Charge {
	return spender.Charge{Key: key, Limits: lim, Cost: ration.Amount{Requests: 1, Tokens: tokens}}
}

// remaining is key's remaining requests and tokens, read with a zero-cost
// reservation that is cancelled.
func remaining(t *testing.T, l *spender.Limiter, key string, lim ration.Limits) (int64, int64) {
	t.Helper()
	r := mustReserve(t, l, key, lim, ration.Amount{})
	defer r.Cancel()
	st := r.Status()
	return st.RemainingRequests, st.RemainingTokens
}

// TestReserveAllIsAllOrNothing: a request charged to a key and to its
// team is admitted only when both admit; a refusal charges neither, names
// the budget that refused and waits for the later of the two.
func TestReserveAllIsAllOrNothing(t *testing.T) {
	clk := fakeclock.New()
	l := newLimiter(t, clk)
	key := ration.Limits{RPM: 6, TPM: 6000}  // a request every 10 s
	team := ration.Limits{RPM: 3, TPM: 6000} // every 20 s
	req := func() []spender.Charge { return []spender.Charge{charge("k", key, 100), charge("team", team, 100)} }

	for i := range 3 {
		if _, err := l.ReserveAll(ctx, req()); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	_, err := l.ReserveAll(ctx, req())
	var rej *spender.RejectError
	if !errors.As(err, &rej) || rej.Key != "team" || rej.RetryAfter != 20*time.Second || !errors.Is(err, spender.ErrRateLimited) {
		t.Fatalf("4th: %v; want a refusal naming team with RetryAfter 20s", err)
	}
	if !strings.Contains(err.Error(), `"team"`) {
		t.Errorf("refusal %q does not name the budget", err)
	}
	if r, tk := remaining(t, l, "k", key); r != 3 || tk != 5700 {
		t.Errorf("the key after the refusal: %d requests, %d tokens left; want 3, 5700 (nothing charged)", r, tk)
	}

	// Both short: the wait is the later one. The key has 3 left: spend them
	// alone, then the key waits 10 s and the team 20 s.
	for range 3 {
		mustReserve(t, l, "k", key, ration.Amount{Requests: 1})
	}
	_, err = l.ReserveAll(ctx, req())
	if !errors.As(err, &rej) || rej.RetryAfter != 20*time.Second || rej.Key != "team" {
		t.Fatalf("both short: %v; want the team's 20s", err)
	}
	clk.Advance(20*time.Second - time.Microsecond)
	if _, err := l.ReserveAll(ctx, req()); err == nil {
		t.Fatal("admitted a microsecond before the named time")
	}
	clk.Advance(time.Microsecond)
	if _, err := l.ReserveAll(ctx, req()); err != nil {
		t.Fatalf("at the named time: %v", err)
	}
}

// TestReserveAllSettlesEveryBudget: Settle refunds (or charges) each
// budget its own actual; Cancel returns every cost; the Status is the most
// restrictive budget per dimension.
func TestReserveAllSettlesEveryBudget(t *testing.T) {
	l := newLimiter(t, fakeclock.New())
	key := ration.Limits{RPM: 100, TPM: 10_000}
	in := ration.Limits{TPM: 1000} // input tokens per minute: only Tokens counts
	rs, err := l.ReserveAll(ctx, []spender.Charge{charge("k", key, 600), {Key: "k/in", Limits: in, Cost: ration.Amount{Tokens: 400}}})
	if err != nil {
		t.Fatal(err)
	}
	if st := rs.Status(); st.LimitRequests != 100 || st.RemainingRequests != 99 || st.LimitTokens != 1000 || st.RemainingTokens != 600 {
		t.Errorf("Status %+v; want requests from the key (99 of 100), tokens from the tighter input budget (600 of 1000)", st)
	}
	if err := rs.Settle([]ration.Amount{{Requests: 1, Tokens: 250}, {Tokens: 150}}); err != nil {
		t.Fatal(err)
	}
	if r, tk := remaining(t, l, "k", key); r != 99 || tk != 9750 {
		t.Errorf("key after settle: %d, %d; want 99, 9750", r, tk)
	}
	if _, tk := remaining(t, l, "k/in", in); tk != 850 {
		t.Errorf("input budget after settle: %d; want 850", tk)
	}
	if err := rs.Settle([]ration.Amount{{}}); err == nil {
		t.Error("Settle with one actual for two budgets: no error")
	}

	rs, err = l.ReserveAll(ctx, []spender.Charge{charge("k", key, 600), {Key: "k/in", Limits: in, Cost: ration.Amount{Tokens: 400}}})
	if err != nil {
		t.Fatal(err)
	}
	rs.Cancel()
	if r, tk := remaining(t, l, "k", key); r != 99 || tk != 9750 {
		t.Errorf("key after cancel: %d, %d; want 99, 9750", r, tk)
	}
}

// TestReserveAllBadInput: bad charges are refused with a clear error and
// change nothing.
func TestReserveAllBadInput(t *testing.T) {
	l := newLimiter(t, fakeclock.New())
	lim := ration.Limits{RPM: 10}
	many := make([]spender.Charge, ration.MaxBudgets+1)
	for i := range many {
		many[i] = charge(fmt.Sprint("k", i), lim, 0)
	}
	for _, tc := range []struct {
		name    string
		charges []spender.Charge
		want    error
	}{
		{"none", nil, spender.ErrInvalidCharges},
		{"twice", []spender.Charge{charge("k", lim, 0), charge("k", lim, 0)}, spender.ErrInvalidCharges},
		{"too many", many, spender.ErrInvalidCharges},
		{"bad key", []spender.Charge{charge("k", lim, 0), charge("", lim, 0)}, spender.ErrInvalidKey},
		{"bad limits", []spender.Charge{charge("k", lim, 0), charge("j", ration.Limits{RPM: -1}, 0)}, ration.ErrInvalidLimits},
		{"bad cost", []spender.Charge{charge("k", lim, 0), {Key: "j", Limits: lim, Cost: ration.Amount{Requests: -1}}}, spender.ErrInvalidCost},
	} {
		if _, err := l.ReserveAll(ctx, tc.charges); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v; want %v", tc.name, err, tc.want)
		}
	}
	if r, _ := remaining(t, l, "k", lim); r != 10 {
		t.Errorf("after bad input k has %d left; want 10", r)
	}
	// Unlimited budgets are admitted and charge nothing.
	if _, err := l.ReserveAll(ctx, []spender.Charge{charge("free", ration.Limits{}, 5)}); err != nil {
		t.Errorf("unlimited: %v", err)
	}
}

// TestReserveAllExactUnderContention: 2000 goroutines, each one request
// charged to its own key's budget and to a shared team budget, on a frozen
// clock. Admissions equal exactly what the tightest budgets allow: no
// over-admission, and no false refusal from a charge that was rolled back.
func TestReserveAllExactUnderContention(t *testing.T) {
	for _, tc := range []struct {
		name            string
		teamRPM, keyRPM int64
		want            int64
	}{
		{"team binds", 500, 40, 500}, // 20 keys of 40 would allow 800
		{"keys bind", 1000, 40, 800}, // the team would allow 1000
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLimiter(t, fakeclock.New())
			admitted, perKey := contend(t, l.ReserveAll, ration.Limits{RPM: tc.teamRPM}, ration.Limits{RPM: tc.keyRPM})
			if admitted != tc.want {
				t.Errorf("admitted %d; want exactly %d", admitted, tc.want)
			}
			for k, n := range perKey {
				if n > tc.keyRPM {
					t.Errorf("key-%d admitted %d, above its %d", k, n, tc.keyRPM)
				}
			}
		})
	}
}

// contend sends 2000 requests at once through reserveAll, each one
// request charged to its key (key-0 to key-19, limits key) and to a team
// budget ("team", limits team), and returns how many were admitted, in
// all and per key.
func contend(t *testing.T, reserveAll func(context.Context, []spender.Charge) (*spender.Reservations, error), team, key ration.Limits) (int64, []int64) {
	var admitted atomic.Int64
	perKey := make([]atomic.Int64, 20)
	var wg sync.WaitGroup
	for i := range 2000 {
		wg.Go(func() {
			k := i % 20
			_, err := reserveAll(ctx, []spender.Charge{charge(fmt.Sprint("key-", k), key, 0), charge("team", team, 0)})
			if err == nil {
				admitted.Add(1)
				perKey[k].Add(1)
			} else if !errors.Is(err, spender.ErrRateLimited) {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	out := make([]int64, len(perKey))
	for k := range perKey {
		out[k] = perKey[k].Load()
	}
	return admitted.Load(), out
}

// TestLeasedReserveAllSharesATeam: two leased gateways, each with its own
// keys, charge a shared team budget on one allocator. Everything is
// admitted from leases while the team lasts; over the run the team's
// admissions stay within its limit, and a refusal charges no key.
func TestLeasedReserveAllSharesATeam(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clk bubbleClock
		alloc := newAllocator(t, clk)
		team := ration.Limits{RPM: 60} // one a second, 60 at once
		key := ration.Limits{RPM: 600} // never binding here
		var ls []*spender.Limiter
		for i := range 2 {
			ls = append(ls, newLeased(t, clk, alloc, spender.WithSpenderID(fmt.Sprint("gw-", i))))
		}
		var admitted, refused int
		for step := range 120 { // 60 s, two requests a second per gateway
			for i, l := range ls {
				rs, err := l.ReserveAll(ctx, []spender.Charge{charge(fmt.Sprint("key-", i), key, 0), charge("team", team, 0)})
				var rej *spender.RejectError
				switch {
				case err == nil:
					admitted++
					for p := range rs.Len() {
						if spender.AdmissionPath(rs.Part(p)) == spender.PathFallback {
							t.Errorf("step %d gateway %d: charge %d admitted by the fallback policy", step, i, p)
						}
					}
					rs.Settle([]ration.Amount{{Requests: 1}, {Requests: 1}})
				case errors.As(err, &rej) && rej.Key == "team":
					refused++
				default:
					t.Fatalf("step %d gateway %d: %v", step, i, err)
				}
			}
			time.Sleep(500 * time.Millisecond)
		}
		// 60 at once plus one a second for 60 s, plus what a refill during
		// the last lease may add: at most 60 + 60 + 2.
		if admitted > 122 || admitted < 110 {
			t.Errorf("admitted %d over a minute on a team of 60 a minute (burst 60); want 110 to 122", admitted)
		}
		if refused == 0 {
			t.Error("nothing refused at twice the team's rate")
		}
		t.Logf("admitted %d, refused %d on the team", admitted, refused)
	})
}
