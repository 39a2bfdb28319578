//go:build faults

package faults

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDeclaredBodiesDoNotTakeMemory opens 40 connections to a gateway
// (run with -read-timeout 5s) that each declare Content-Length: 16000000
// with a valid key and send no body. Once all 40 are in the gateway's
// handler (ration_gateway_in_flight), the process's resident memory
// (VmRSS in /proc/PID/status, sampled for a second, and VmHWM, its peak
// since start) stays under 100 MB: a body is read as it arrives, never
// sized from its declared length. Each is then answered 408 (or closed)
// after the read timeout, and none is admitted.
func TestDeclaredBodiesDoNotTakeMemory(t *testing.T) {
	const (
		n           = 40
		declared    = 16_000_000
		readTimeout = 5 * time.Second
		slack       = 1500 * time.Millisecond
		limitKB     = 100 << 10 // 100 MB
	)
	ctx := deadline(t, 30*time.Second)
	k := key{Key: "sk-faults-memory", ID: "faults-memory", Tenant: "faults", RPM: 600}
	gw := startGateway(ctx, t, "gateway", gatewaySpec{instances: 1, ttl: 2 * time.Second, keysFile: writeKeys(t, k),
		extra: []string{"-read-timeout", readTimeout.String()}})
	pid := gw.pid()
	before := statusKB(t, pid, "VmRSS")

	results := make([]slowConn, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			// A tick longer than the wait: no byte of the body is ever sent.
			results[i] = slowBody(ctx, strings.TrimPrefix(gw.urls[0], "http://"), declaredHead(bearer(k.Key), declared),
				time.Hour, readTimeout+slack)
		})
	}
	var inFlight float64
	err := poll(ctx, 20*time.Millisecond, func() (bool, error) {
		c, err := readGateways(ctx, gw.urls)
		inFlight = c.inFlight
		return err == nil && inFlight >= n, err
	})
	if err != nil {
		t.Fatalf("only %.0f of %d requests reached the gateway's handler: %v", inFlight, n, err)
	}
	var peak int64
	for range 20 { // a second of samples while every request waits for its body
		peak = max(peak, statusKB(t, pid, "VmRSS"))
		pause(ctx, 50*time.Millisecond)
	}
	hwm := statusKB(t, pid, "VmHWM")
	t.Logf("VmRSS %d KiB before; with %d bodies of %d bytes declared: VmRSS up to %d KiB, VmHWM %d KiB",
		before, n, declared, peak, hwm)
	if peak >= limitKB || hwm >= limitKB {
		t.Errorf("the gateway's resident memory reached %d KiB (VmHWM %d KiB); want under 100 MB", peak, hwm)
	}

	wg.Wait()
	counts := map[int]int{}
	var cut []time.Duration
	for i, r := range results {
		counts[r.status]++
		cut = append(cut, r.closed)
		if r.err != nil {
			t.Errorf("connection %d: %v", i, r.err)
		} else if r.status != http.StatusRequestTimeout && r.status != 0 {
			t.Errorf("connection %d: status %d, want 408 or a close", i, r.status)
		}
	}
	t.Logf("then: %s, all closed within %v of their head (read timeout %v)", describe(counts), longest(cut).Round(time.Millisecond), readTimeout)
	if c := mustReadGateways(ctx, t, gw.urls); c.admitted != 0 {
		t.Errorf("the gateway admitted %.0f requests whose body never came", c.admitted)
	}
	gw.alive(t)
}
