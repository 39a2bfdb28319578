//go:build faults

package faults

import (
	"fmt"
	"testing"
	"time"
)

// TestSaturatedSkewStaysLocal is the refill shares' check on real
// processes (docs/leasing.md, "Rate shares"): three gateway-demo
// processes on one allocator process, a key at three times its limit
// split 80/15/5, once its burst is spent. Read from the gateways' own
// metrics over the saturated phase: at most 0.05 allocator calls
// (Acquire attempts) per admission, and at most 2% of the requests
// admitted after waiting for the allocator (admitted_total{path="slow"});
// the bound holds over the whole run.
func TestSaturatedSkewStaysLocal(t *testing.T) {
	const (
		rpm      = 1200             // C = 1200, ρ = 20 a second
		ttl      = 10 * time.Second // the allocator's default: shares are renewed every 5 s
		drain    = 5 * time.Second  // 300 a second: the burst C is spent
		duration = 20 * time.Second // then three times ρ
	)
	ctx := deadline(t, drain+duration+40*time.Second)
	k := key{Key: "sk-faults-saturated", ID: "faults-saturated", Tenant: "faults", RPM: rpm}
	keys := writeKeys(t, k)
	alloc := startAllocator(ctx, t, ttl, "")
	var gws []*gatewayProc
	for i := range 3 {
		gws = append(gws, startGateway(ctx, t, fmt.Sprintf("gateway %d of 3", i+1), gatewaySpec{
			instances: 1, keysFile: keys, alloc: alloc, spenderID: fmt.Sprintf("faults-saturated-%d", i+1)}))
	}
	urls := urlsOf(gws...)
	weights := []int{16, 3, 1}

	start := time.Now()
	l := startLoad(ctx, loadSpec{key: k.Key, targets: urls, weights: weights, rate: 300, workers: 64})
	pause(ctx, drain)
	first := l.stop(ctx, t)
	before := mustReadGateways(ctx, t, urls)
	l = startLoad(ctx, loadSpec{key: k.Key, targets: urls, weights: weights, rate: 3 * rpm / 60.0, workers: 32})
	pause(ctx, duration)
	res := l.stop(ctx, t)
	after := mustReadGateways(ctx, t, urls)
	res.only200or429(t)

	admitted, offered := after.admitted-before.admitted, float64(res.total())
	calls, slow := after.acquireCalls-before.acquireCalls, after.slow-before.slow
	t.Logf("saturated phase, %v at 3×ρ: %v; gateways admitted %.0f, %.0f Acquire attempts (%.3f per admission), %.0f after waiting for the allocator (%.1f%% of %.0f requests)",
		duration, res, admitted, calls, calls/max(admitted, 1), slow, 100*slow/max(offered, 1), offered)
	t.Logf("allocator calls: %s", allocatorCalls(mustScrape(ctx, t, alloc.url()+"/metrics")))
	if admitted < 0.9*rpm/60*duration.Seconds() {
		t.Errorf("admitted %.0f in the saturated phase, below 90%% of what the limit allows (%.0f)", admitted, rpm/60*duration.Seconds())
	}
	if calls > 0.05*admitted {
		t.Errorf("%.0f allocator calls for %.0f admissions: more than 0.05 a admission", calls, admitted)
	}
	if slow > 0.02*offered {
		t.Errorf("%.0f of %.0f requests waited for the allocator: more than 2%%", slow, offered)
	}
	// The bound over the whole run, both phases: the window from before the
	// first phase's first request to after the last answer (a little longer
	// than the run, so the bound a little looser).
	whole := first.plus(res)
	whole.elapsed = time.Since(start)
	checkBound(t, run{rpm: rpm, ttl: ttl, clients: whole, gw: after})
	noEpochTrouble(t, gws...)
	alloc.alive(t)
}
