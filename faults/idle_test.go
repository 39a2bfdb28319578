//go:build faults

package faults

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestIdleConnectionsAreClosed opens 2000 idle connections to a gateway
// and 2000 to the allocator, both run with -idle-timeout and
// -read-header-timeout 5s (internal/serverlimits): half have sent one
// request and wait under the idle timeout, half sent nothing and wait
// under the read-header timeout. The server closes every one within the
// timeout plus 1.5 s of its last activity, and the process's goroutines
// (go_goroutines on its /metrics) and open file descriptors
// (/proc/PID/fd) fall back to where they were.
func TestIdleConnectionsAreClosed(t *testing.T) {
	const (
		n       = 2000
		timeout = 5 * time.Second // above the time to open them all, even on a busy machine
		slack   = 1500 * time.Millisecond
	)
	needFDs(t, 2*n+64)
	ctx := deadline(t, 45*time.Second)
	limits := []string{"-idle-timeout", timeout.String(), "-read-header-timeout", timeout.String()}
	alloc := startAllocator(ctx, t, 2*time.Second, "", limits...)
	gw := startGateway(ctx, t, "gateway", gatewaySpec{instances: 1, ttl: 2 * time.Second, extra: limits,
		keysFile: writeKeys(t, key{Key: "sk-faults-idle", ID: "faults-idle", Tenant: "faults", RPM: 600})})

	for _, target := range []struct {
		name, base string
		p          *proc
	}{
		{"gateway", gw.urls[0], gw.proc},
		{"allocator", alloc.url(), alloc.proc},
	} {
		t.Run(target.name, func(t *testing.T) {
			t.Parallel() // both servers at once: the case takes one timeout, not two
			idleCase(ctx, t, target.p, target.base, n, timeout, slack)
		})
	}
}

// idleCase is TestIdleConnectionsAreClosed against one server.
func idleCase(ctx context.Context, t *testing.T, p *proc, base string, n int, timeout, slack time.Duration) {
	goroutines := func() float64 { return mustScrape(ctx, t, base+"/metrics").sum("go_goroutines") }
	g0, fd0 := goroutines(), openFDs(t, p.pid())
	ic := openIdle(ctx, t, strings.TrimPrefix(base, "http://"), n, "GET /healthz HTTP/1.1\r\nHost: faults\r\n\r\n")
	gPeak, fdPeak := goroutines(), openFDs(t, p.pid())
	t.Logf("%d connections opened in %v: goroutines %.0f -> %.0f, open fds %d -> %d",
		n, ic.opened.Round(time.Millisecond), g0, gPeak, fd0, fdPeak)
	if gPeak < g0+float64(n)*0.9 || fdPeak < fd0+n*9/10 {
		t.Errorf("with %d connections open the server held %.0f more goroutines and %d more fds: the connections did not reach it",
			n, gPeak-g0, fdPeak-fd0)
	}

	res := ic.waitClosed(timeout + slack)
	t.Logf("closed by the server: %d of %d, the last %v after its last activity (timeout %v)",
		res.closed, n, res.longest.Round(time.Millisecond), timeout)
	if res.stayed > 0 || res.gotData > 0 {
		t.Errorf("of %d idle connections, %d stayed open past %v and %d got unasked-for data", n, res.stayed, timeout+slack, res.gotData)
	}

	var g, fd float64
	err := poll(ctx, 50*time.Millisecond, func() (bool, error) {
		g, fd = goroutines(), float64(openFDs(t, p.pid()))
		return g <= g0+10 && fd <= float64(fd0)+10, nil
	})
	t.Logf("after the closes: goroutines %.0f, open fds %.0f", g, fd)
	if err != nil {
		t.Errorf("goroutines %.0f (before: %.0f) and open fds %.0f (before: %d) did not fall back: %v", g, g0, fd, fd0, err)
	}
	p.alive(t)
}
