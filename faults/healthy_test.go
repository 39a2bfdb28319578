//go:build faults

package faults

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// wentToFallback is the spender's warning when it counts the allocator as
// unreachable and switches to its fallback policy (setFallback in
// spender/machine.go logs every switch, so a switch too short for a
// scrape of the fallback gauge to see still shows here).
var wentToFallback = regexp.MustCompile(`.*allocator unreachable; spending valid leases, then falling back.*`)

// TestHealthyRunUnderCPUStress runs three gateway-demo processes, each
// with its own spender id, on one allocator process, while a burner
// process keeps both cores busy, and sends them half the key's limit for
// 60 s, evenly. A slow allocator is not an outage (docs/leasing.md, "The
// slow path"): no request is refused 429, none is admitted under the
// fallback policy (ration_spender_admitted_total{path="fallback"}), no
// gateway switches to fallback at all (its "allocator unreachable"
// warning), and none logs that the allocator refused its epoch. The bound
// holds, trivially at this load.
func TestHealthyRunUnderCPUStress(t *testing.T) {
	const (
		rpm      = 600 // 10 a second
		ttl      = 2 * time.Second
		duration = 60 * time.Second
	)
	ctx := deadline(t, duration+40*time.Second)
	k := key{Key: "sk-faults-healthy", ID: "faults-healthy", Tenant: "faults", RPM: rpm}
	keys := writeKeys(t, k)
	alloc := startAllocator(ctx, t, ttl, "")
	var gws []*gatewayProc
	for i := range 3 {
		gws = append(gws, startGateway(ctx, t, fmt.Sprintf("gateway %d", i+1), gatewaySpec{
			instances: 1, keysFile: keys, alloc: alloc, spenderID: fmt.Sprintf("faults-healthy-%d", i+1)}))
	}
	burner := startBurner(t, 2)
	urls := urlsOf(gws...)

	l := startLoad(ctx, loadSpec{key: k.Key, targets: urls, rate: rpm / 60.0 / 2, workers: 16})
	pause(ctx, duration)
	res := l.stop(ctx, t)
	burner.alive(t)
	t.Logf("clients: %v", res)
	res.only200or429(t)
	if n := res.count(http.StatusTooManyRequests); n > 0 {
		t.Errorf("%d requests refused 429 at half the key's limit", n)
	}
	gw := mustReadGateways(ctx, t, urls)
	t.Logf("gateways: %.0f admitted (%.0f from leases, %.0f under fallback), %.0f refused, %.0f allocator call attempts failed",
		gw.admitted, gw.leased, gw.fallback, gw.rateLimited, gw.callErrors)
	t.Logf("allocator calls: %s", allocatorCalls(mustScrape(ctx, t, alloc.url()+"/metrics")))
	if gw.fallback > 0 {
		t.Errorf("%.0f requests admitted under the fallback policy with a healthy allocator", gw.fallback)
	}
	for _, g := range gws {
		if lines := wentToFallback.FindAllString(g.logs.String(), -1); len(lines) > 0 {
			t.Errorf("%s counted the healthy allocator as unreachable %d times:\n%s", g.name, len(lines), strings.Join(lines, "\n"))
		}
	}
	checkBound(t, run{rpm: rpm, ttl: ttl, clients: res, gw: gw})
	noEpochTrouble(t, gws...)
	for _, g := range gws {
		g.alive(t)
	}
	alloc.alive(t)
}
