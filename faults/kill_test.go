//go:build faults

package faults

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestAllocatorKill9KeepsTheBound kills the allocator with SIGKILL four
// times under a load above the key's limit, restarting it each time on the
// same data directory and port after more than half a lease TTL. The gateways keep answering (200 or 429,
// never a 5xx), every restart recovers all its state ("not_vouched":0:
// what was answered was durable), the bound holds over the whole run, and
// after the last restart the gateways are admitted from leases again.
func TestAllocatorKill9KeepsTheBound(t *testing.T) {
	ctx := deadline(t, 60*time.Second)
	const (
		kills = 4
		ttl   = 2 * time.Second
	)
	f := startFleet(ctx, t, fleetSpec{name: "kill", rpm: 600, ttl: ttl, procs: 2, instances: 2})
	l := f.overLimit(ctx, t, 150)

	var downs []time.Duration
	for i := range kills {
		pause(ctx, 1500*time.Millisecond)
		killed := time.Now()
		f.alloc.signal(t, syscall.SIGKILL)
		if err := f.alloc.wait(ctx); err == nil {
			t.Fatalf("allocator exited 0 after SIGKILL")
		}
		// Down for longer than half the lease TTL: a spender holding a
		// refill share calls only to renew it, every half TTL, and a
		// restart within a few tens of milliseconds could fall between
		// all the fleet's calls.
		pause(ctx, ttl/2+100*time.Millisecond)
		f.alloc.restart(ctx, t)
		downs = append(downs, time.Since(killed))
		if logs := f.alloc.logs.String(); !strings.Contains(logs, `"not_vouched":0`) {
			t.Fatalf("restart %d recovered state it cannot vouch for after kill -9:\n%s", i+1, logs)
		}
	}
	t.Logf("allocator down (SIGKILL to ready again): %v", downs)

	mark := mustReadGateways(ctx, t, f.urls())
	back := f.waitLeased(ctx, t, mark, 20)
	t.Logf("after the last restart: 20 lease admissions and no instance in fallback within %v", back.Round(time.Millisecond))
	_, gw, _ := f.finish(ctx, t, l)
	t.Logf("lease call errors at the gateways: %.0f", gw.callErrors)
	if gw.callErrors == 0 {
		t.Errorf("no gateway saw a failed allocator call: the kills did not reach them")
	}
}
