package spender_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/spender"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// The HTTP stage takes a Router in place of a Limiter.
var (
	_ spenderhttp.Reserver      = (*spender.Router)(nil)
	_ spenderhttp.MultiReserver = (*spender.Router)(nil)
)

// TestRouteIsPinned: the cluster of a key depends on the set of names
// alone, not their order, and does not move between versions (every
// gateway of a rolling upgrade must agree).
func TestRouteIsPinned(t *testing.T) {
	names := []string{"eu-1", "us-1", "ap-1"}
	want := map[string]string{
		"key-0": "us-1", "key-1": "us-1", "key-2": "ap-1", "key-3": "ap-1",
		"sk-demo": "ap-1", "team:acme": "us-1", "a": "ap-1", "": "eu-1",
	}
	orders := [][]string{names, {"ap-1", "eu-1", "us-1"}, {"us-1", "ap-1", "eu-1"}}
	for key, cluster := range want {
		for _, o := range orders {
			if i := spender.Route(o, key); i < 0 || o[i] != cluster {
				t.Errorf("Route(%q, %q) = %d; want %s", o, key, i, cluster)
			}
		}
	}
	for _, tc := range []struct {
		names []string
		want  int
	}{{nil, -1}, {[]string{"only"}, 0}} {
		if got := spender.Route(tc.names, "k"); got != tc.want {
			t.Errorf("Route(%q) = %d; want %d", tc.names, got, tc.want)
		}
	}
}

// clusterNames returns n names, c0 … c(n-1).
func clusterNames(n int) []string {
	ns := make([]string, n)
	for i := range ns {
		ns[i] = fmt.Sprint("c", i)
	}
	return ns
}

// TestRouteSpreadsKeys: 60,000 keys over 2 to 7 clusters land within 3%
// of an even share on each (binomial spread: about 0.5–0.9%).
func TestRouteSpreadsKeys(t *testing.T) {
	const keys = 60_000
	for n := 2; n <= 7; n++ {
		names := clusterNames(n)
		count := make([]int, n)
		for k := range keys {
			count[spender.Route(names, fmt.Sprint("key-", k))]++
		}
		for i, c := range count {
			if share := float64(c) * float64(n) / keys; share < 0.97 || share > 1.03 {
				t.Errorf("%d clusters: %s has %d keys, %.3f of an even share", n, names[i], c, share)
			}
		}
	}
}

// TestRouteMovesFewKeys: adding a cluster to n moves only keys that go to
// the new cluster, about 1/(n+1) of them; removing one moves only its own
// keys, each to another cluster.
func TestRouteMovesFewKeys(t *testing.T) {
	const keys = 30_000
	for n := 1; n <= 6; n++ {
		before, after := clusterNames(n), clusterNames(n+1)
		moved := 0
		for k := range keys {
			key := fmt.Sprint("user-", k)
			a, b := before[spender.Route(before, key)], after[spender.Route(after, key)]
			if a == b {
				continue
			}
			moved++
			if b != after[n] {
				t.Fatalf("adding %s to %d clusters moved %s from %s to %s", after[n], n, key, a, b)
			}
		}
		if frac, want := float64(moved)/keys, 1/float64(n+1); frac < 0.97*want || frac > 1.03*want {
			t.Errorf("adding a cluster to %d moved %.4f of the keys; want %.4f ± 3%%", n, frac, want)
		}
		// Removing cluster c0 (the first) from after.
		rest := after[1:]
		for k := range keys {
			key := fmt.Sprint("user-", k)
			a, b := after[spender.Route(after, key)], rest[spender.Route(rest, key)]
			if a != b && a != "c0" {
				t.Fatalf("removing c0 moved %s from %s to %s", key, a, b)
			}
		}
	}
}

// TestNewRouterRefuses: every bad cluster list is an ErrInvalidOption
// that says what is wrong.
func TestNewRouterRefuses(t *testing.T) {
	clk := fakeclock.New()
	a, b := newLimiter(t, clk), newLimiter(t, clk)
	for _, tc := range []struct {
		name     string
		clusters []spender.Cluster
		says     string
	}{
		{"none", nil, "no clusters"},
		{"empty name", []spender.Cluster{{Name: "", Limiter: a}}, "empty name"},
		{"zero byte", []spender.Cluster{{Name: "a\x00b", Limiter: a}}, "zero byte"},
		{"no limiter", []spender.Cluster{{Name: "a"}}, "no Limiter"},
		{"name twice", []spender.Cluster{{Name: "a", Limiter: a}, {Name: "a", Limiter: b}}, "both named"},
		{"limiter twice", []spender.Cluster{{Name: "a", Limiter: a}, {Name: "b", Limiter: a}}, "share one Limiter"},
	} {
		r, err := spender.NewRouter(tc.clusters...)
		if r != nil || !errors.Is(err, spender.ErrInvalidOption) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, %v; want ErrInvalidOption saying %q", tc.name, r, err, tc.says)
		}
	}
}

// routerOf returns a Router over standalone Limiters named by names, and
// the Limiters by name.
func routerOf(t *testing.T, clk ration.Clock, names ...string) (*spender.Router, map[string]*spender.Limiter) {
	t.Helper()
	lims := map[string]*spender.Limiter{}
	var cs []spender.Cluster
	for _, n := range names {
		lims[n] = newLimiter(t, clk)
		cs = append(cs, spender.Cluster{Name: n, Limiter: lims[n]})
	}
	r, err := spender.NewRouter(cs...)
	if err != nil {
		t.Fatal(err)
	}
	return r, lims
}

// keyOn returns a key (prefix-i, the first i that fits) that r routes to
// cluster.
func keyOn(r *spender.Router, cluster, prefix string) string {
	for i := 0; ; i++ {
		if k := fmt.Sprint(prefix, "-", i); r.Cluster(k) == cluster {
			return k
		}
	}
}

// TestRouterSendsEachKeyToItsCluster: a key's reservations reach its
// cluster's Limiter and no other.
func TestRouterSendsEachKeyToItsCluster(t *testing.T) {
	clk := fakeclock.New()
	r, lims := routerOf(t, clk, "a", "b", "c")
	lim := ration.Limits{RPM: 10}
	on := map[string]int{}
	for k := range 30 {
		key := fmt.Sprint("key-", k)
		if _, err := r.Reserve(ctx, key, lim, ration.Amount{Requests: 1}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := r.ReserveAt(ctx, key, lim, ration.Amount{Requests: 1}, time.Minute); err != nil {
			t.Fatal(err)
		}
		on[r.Cluster(key)]++
	}
	for name, l := range lims {
		if l.Keys() != on[name] || on[name] == 0 {
			t.Errorf("%s holds %d keys; %d were routed to it", name, l.Keys(), on[name])
		}
	}
	if r.Keys() != 30 {
		t.Errorf("Keys() = %d; want 30", r.Keys())
	}
	for k := range 30 {
		key := fmt.Sprint("key-", k)
		for name, l := range lims {
			if got := remainingOf(t, l, key, lim); (name == r.Cluster(key)) != (got == 8) {
				t.Errorf("%s on %s: %d left on %s", key, r.Cluster(key), got, name)
			}
		}
	}
}

// remainingOf is key's remaining requests on l.
func remainingOf(t *testing.T, l *spender.Limiter, key string, lim ration.Limits) int64 {
	t.Helper()
	rq, _ := remaining(t, l, key, lim)
	return rq
}

// TestRouterReserveAllAcrossClusters: a request charged to budgets on
// different clusters is admitted on every one or none; a refusal on one
// cluster leaves nothing reserved on the others, and names the budget
// that refused, as one Limiter would.
func TestRouterReserveAllAcrossClusters(t *testing.T) {
	lim := ration.Limits{RPM: 10}
	one := ration.Amount{Requests: 1}
	for _, tc := range []struct {
		name    string
		spend   int64 // spent on the b budget first
		costB   ration.Amount
		limitsB ration.Limits
		want    error // nil: admitted
	}{
		{"admitted", 0, one, lim, nil},
		{"b short", 10, one, lim, spender.ErrRateLimited},
		{"b oversize", 0, ration.Amount{Requests: 11}, lim, spender.ErrExceedsCapacity},
		{"b bad limits", 0, one, ration.Limits{RPM: -1}, ration.ErrInvalidLimits},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := fakeclock.New()
			r, lims := routerOf(t, clk, "a", "b", "c")
			ka, kb, kc := keyOn(r, "a", "k"), keyOn(r, "b", "k"), keyOn(r, "c", "k")
			if tc.spend > 0 {
				mustReserve(t, lims["b"], kb, lim, ration.Amount{Requests: tc.spend})
			}
			charges := []spender.Charge{
				{Key: ka, Limits: lim, Cost: one},
				{Key: kb, Limits: tc.limitsB, Cost: tc.costB},
				{Key: kc, Limits: lim, Cost: ration.Amount{Requests: 2}},
				{Key: "free", Limits: ration.Limits{}, Cost: one},
			}
			rs, err := r.ReserveAll(ctx, charges)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (rs != nil) {
				t.Fatalf("ReserveAll: %v, %v; want %v", rs, err, tc.want)
			}
			var rej *spender.RejectError
			if errors.As(err, &rej) && rej.Key != kb {
				t.Errorf("the refusal names %q; want %q", rej.Key, kb)
			}
			wantA, wantC := int64(10), int64(10)
			if rs != nil {
				wantA, wantC = 9, 8
				if rs.Len() != 4 || rs.Status().RemainingRequests != min(9, 10-tc.costB.Requests, 8) {
					t.Errorf("reservations: %d parts, status %+v", rs.Len(), rs.Status())
				}
			}
			if a, c := remainingOf(t, lims["a"], ka, lim), remainingOf(t, lims["c"], kc, lim); a != wantA || c != wantC {
				t.Errorf("left on a %d, on c %d; want %d, %d", a, c, wantA, wantC)
			}
			if rs == nil {
				return
			}
			// Settled with what each used, per charge in order.
			if err := rs.Settle([]ration.Amount{{}, one, one, one}); err != nil {
				t.Fatal(err)
			}
			if a, c := remainingOf(t, lims["a"], ka, lim), remainingOf(t, lims["c"], kc, lim); a != 10 || c != 9 {
				t.Errorf("after settling, left on a %d, on c %d; want 10, 9", a, c)
			}
		})
	}
}

// TestRouterReserveAllBadInput: the charges are checked before any
// cluster is asked.
func TestRouterReserveAllBadInput(t *testing.T) {
	r, lims := routerOf(t, fakeclock.New(), "a", "b")
	lim := ration.Limits{RPM: 10}
	ka, kb := keyOn(r, "a", "k"), keyOn(r, "b", "k")
	for _, tc := range []struct {
		name    string
		charges []spender.Charge
		want    error
	}{
		{"none", nil, spender.ErrInvalidCharges},
		{"twice", []spender.Charge{charge(ka, lim, 0), charge(ka, lim, 0)}, spender.ErrInvalidCharges},
		{"bad key", []spender.Charge{charge(ka, lim, 0), charge("", lim, 0)}, spender.ErrInvalidKey},
		{"bad cost", []spender.Charge{charge(ka, lim, 0), {Key: kb, Limits: lim, Cost: ration.Amount{Requests: -1}}}, spender.ErrInvalidCost},
	} {
		if _, err := r.ReserveAll(ctx, tc.charges); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v; want %v", tc.name, err, tc.want)
		}
	}
	if a, b := remainingOf(t, lims["a"], ka, lim), remainingOf(t, lims["b"], kb, lim); a != 10 || b != 10 {
		t.Errorf("after bad input: %d and %d left; want 10 and 10", a, b)
	}
}

// TestRouterReserveAllUnderContention: 2,000 goroutines charge their key
// (20 keys, spread over three clusters) and a team budget on one of them.
// No budget admits more than its limit, and once every request is decided
// each budget has spent exactly what was admitted on it: a refusal
// elsewhere left nothing behind. (A request may be refused while another's
// cancelled charge is still held, so the count may fall short of the
// tightest budget: the Router's ReserveAll is all or nothing, not atomic.)
func TestRouterReserveAllUnderContention(t *testing.T) {
	r, lims := routerOf(t, fakeclock.New(), "a", "b", "c")
	team, key := ration.Limits{RPM: 500}, ration.Limits{RPM: 40}
	admitted, perKey := contend(t, r.ReserveAll, team, key)
	if admitted > 500 || admitted < 400 {
		t.Errorf("admitted %d; want at most the team's 500 (and not far below)", admitted)
	}
	if left := remainingOf(t, lims[r.Cluster("team")], "team", team); left != 500-admitted {
		t.Errorf("team: %d left after %d admitted", left, admitted)
	}
	for k := range perKey {
		name := fmt.Sprint("key-", k)
		if left := remainingOf(t, lims[r.Cluster(name)], name, key); left != 40-perKey[k] {
			t.Errorf("%s: %d left after %d admitted", name, left, perKey[k])
		}
	}
}

// TestRouterClusterLossStaysOnItsKeys: three clusters, each its own
// allocator; one is cut off. Its keys are admitted by the fallback policy
// and only its cluster is reported unready, while the other clusters'
// keys keep being granted leases by their allocators: none refused, none
// admitted by the fallback policy.
func TestRouterClusterLossStaysOnItsKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clk bubbleClock
		names := []string{"a", "b", "c"}
		nets := map[string]*simnet{} // one allocator per cluster, each behind its own network
		var cs []spender.Cluster
		for _, n := range names {
			nets[n] = &simnet{src: newAllocator(t, clk)}
			cs = append(cs, spender.Cluster{Name: n, Limiter: newLeased(t, clk, nets[n], spender.WithSpenderID("gw"),
				testTuning(20*time.Millisecond))})
		}
		r, err := spender.NewRouter(cs...)
		if err != nil {
			t.Fatal(err)
		}
		lim := ration.Limits{RPM: 600} // 10 a second per key
		keys := make([]string, 30)
		for k := range keys {
			keys[k] = fmt.Sprint("key-", k)
		}
		// Each key offers 8 a second (below its limit) for d; by cluster,
		// the refusals and the admissions by the fallback policy.
		offer := func(d time.Duration) (rejected, fallback map[string]int) {
			rejected, fallback = map[string]int{}, map[string]int{}
			rng := rand.New(rand.NewPCG(1, 2))
			for range int(d / (125 * time.Millisecond)) {
				for _, k := range keys {
					rs, err := r.Reserve(ctx, k, lim, ration.Amount{Requests: 1})
					if err != nil {
						rejected[r.Cluster(k)]++
						continue
					}
					if spender.AdmissionPath(rs) == spender.PathFallback {
						fallback[r.Cluster(k)]++
					}
					rs.Settle(ration.Amount{Requests: 1})
				}
				clk.Advance(125*time.Millisecond + time.Duration(rng.IntN(1000))*time.Microsecond)
			}
			return rejected, fallback
		}
		offer(30 * time.Second)
		if err := r.Ready(); err != nil {
			t.Fatalf("before the loss: %v", err)
		}
		before := map[string]int64{}
		for _, n := range names {
			before[n] = nets[n].calls.Load()
		}
		nets["b"].partitioned.Store(true)
		rejected, fallback := offer(60 * time.Second)
		err = r.Ready()
		if !errors.Is(err, spender.ErrAllocatorUnreachable) || !strings.Contains(err.Error(), `cluster "b"`) ||
			strings.Contains(err.Error(), `cluster "a"`) || strings.Contains(err.Error(), `cluster "c"`) {
			t.Errorf("Ready during the loss of b: %v; want b unreachable, and only b", err)
		}
		for _, n := range []string{"a", "c"} {
			// A lease lasts the allocator's TTL (10 s): every admission
			// over the 60 s came from leases renewed during the loss, at
			// least one call per TTL.
			calls := nets[n].calls.Load() - before[n]
			if calls < 6 || rejected[n] > 0 || fallback[n] > 0 {
				t.Errorf("cluster %s during the loss of b: %d allocator calls (%d in the 30 s before), %d refusals, %d by fallback",
					n, calls, before[n], rejected[n], fallback[n])
			}
		}
		if fallback["b"] == 0 {
			t.Errorf("cluster b admitted nothing by its fallback policy while cut off")
		}
		nets["b"].partitioned.Store(false)
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := r.Flush(fctx); err != nil {
			t.Fatal(err)
		}
		if err := r.Ready(); err != nil {
			t.Errorf("after b is back: %v", err)
		}
		if err := r.Close(fctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}
