//go:build faults

package faults

import (
	"syscall"
	"testing"
	"time"
)

// TestAllocatorSIGSTOPKeepsTheBound freezes the allocator with SIGSTOP for
// 5 s under a load above the key's limit, then SIGCONT. Its connections
// stay open but nothing answers: the gateways' calls time out, they spend
// their leases and then follow the fallback policy, answering every
// request 200 or 429 meanwhile; none exits; the bound holds over the
// run; and once the allocator runs again they are admitted from leases.
func TestAllocatorSIGSTOPKeepsTheBound(t *testing.T) {
	ctx := deadline(t, 60*time.Second)
	f := startFleet(ctx, t, fleetSpec{name: "stop", rpm: 600, ttl: 2 * time.Second, procs: 2, instances: 2})
	l := f.overLimit(ctx, t, 150)
	pause(ctx, time.Second)

	before := mustReadGateways(ctx, t, f.urls())
	f.alloc.signal(t, syscall.SIGSTOP)
	stopped := time.Now()
	pause(ctx, 5*time.Second)
	during := mustReadGateways(ctx, t, f.urls())
	f.alloc.signal(t, syscall.SIGCONT)
	t.Logf("allocator stopped for %v; meanwhile the gateways admitted %.0f (%.0f under fallback), %.0f allocator calls failed, %.0f of %d instances in fallback",
		time.Since(stopped).Round(time.Millisecond), during.admitted-before.admitted, during.fallback-before.fallback,
		during.callErrors-before.callErrors, during.inFallback, len(f.urls()))
	if during.callErrors == before.callErrors {
		t.Errorf("no allocator call failed while it was stopped for 5 s")
	}

	back := f.waitLeased(ctx, t, during, 20)
	t.Logf("after SIGCONT: 20 lease admissions and no instance in fallback within %v", back.Round(time.Millisecond))
	f.alloc.alive(t)
	f.finish(ctx, t, l)
}
