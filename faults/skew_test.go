//go:build faults

package faults

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// TestSkewAcrossProcessesMatchesOneProcess sends a key traffic above its
// limit split 80/15/5, once across three separate gateway-demo processes
// (one instance each, own spender ids) and once across the three
// instances of one gateway-demo process (-instances 3), both on one
// allocator process, each on its own fresh key. The utilisation (what was
// admitted over what the limit allows in the window, C + ρ·t) of the
// separate processes is within 1 percentage point of the single
// process's; the bound holds in both; no gateway logs that the allocator
// refused its epoch; and on SIGINT every process exits 0 saying it
// returned every lease.
func TestSkewAcrossProcessesMatchesOneProcess(t *testing.T) {
	const (
		rpm      = 600 // C = 600, ρ = 10 a second
		ttl      = 2 * time.Second
		duration = 12 * time.Second
		rate     = 120 // offered a second: 12× ρ, 1440 in all against the 720 allowed
	)
	weights := []int{16, 3, 1} // 80%, 15%, 5%
	ctx := deadline(t, 70*time.Second)
	sep := key{Key: "sk-faults-skew-sep", ID: "faults-skew-sep", Tenant: "faults", RPM: rpm}
	one := key{Key: "sk-faults-skew-one", ID: "faults-skew-one", Tenant: "faults", RPM: rpm}
	keys := writeKeys(t, sep, one)
	alloc := startAllocator(ctx, t, ttl, "")

	var separate []*gatewayProc
	for i := range 3 {
		separate = append(separate, startGateway(ctx, t, fmt.Sprintf("gateway %d of 3", i+1), gatewaySpec{
			instances: 1, keysFile: keys, alloc: alloc, spenderID: fmt.Sprintf("faults-skew-sep-%d", i+1)}))
	}
	single := startGateway(ctx, t, "gateway with 3 instances", gatewaySpec{
		instances: 3, keysFile: keys, alloc: alloc, spenderID: "faults-skew-one"})

	skewed := func(name string, k key, gws ...*gatewayProc) boundReport {
		urls := urlsOf(gws...)
		l := startLoad(ctx, loadSpec{key: k.Key, targets: urls, weights: weights, rate: rate, workers: 64})
		pause(ctx, duration)
		res := l.stop(ctx, t)
		res.only200or429(t)
		var table strings.Builder
		for i, m := range res.byTarget {
			fmt.Fprintf(&table, " instance %d (%d%%): %d×200 %d×429;", i+1, weights[i]*5, m[200], m[429])
		}
		t.Logf("%s: %v;%s", name, res, table.String())
		b := checkBound(t, run{rpm: rpm, ttl: ttl, clients: res, gw: mustReadGateways(ctx, t, urls)})
		return b
	}
	// One after the other, so that neither run takes CPU from the other.
	a := skewed("3 processes", sep, separate...)
	b := skewed("1 process, 3 instances", one, single)
	ua, ub := a.admitted/a.allows, b.admitted/b.allows
	t.Logf("utilisation: 3 processes %.2f%%, 1 process %.2f%%: %+.2f points", 100*ua, 100*ub, 100*(ua-ub))
	if math.Abs(ua-ub) > 0.01 {
		t.Errorf("utilisation across processes %.2f%% vs in one process %.2f%%: more than 1 point apart", 100*ua, 100*ub)
	}

	all := append(separate, single)
	noEpochTrouble(t, all...)
	stopCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for _, g := range all {
		g.interrupt(stopCtx, t)
		if !strings.Contains(g.logs.String(), "every lease returned") {
			t.Errorf("%s stopped without logging that it returned every lease", g.name)
		}
	}
	alloc.alive(t)
}
