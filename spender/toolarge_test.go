package spender_test

import (
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender"
)

// TestTooLargeUnderOldLimitsIsNotOversize: while a key's limits change
// (a keys file reloaded), requests still in flight carry the old limits,
// so a call can reach the allocator with the old limits and the need of a
// request made under the new ones, and be answered TOO_LARGE. That answer
// is about the old limits: the request made under the new ones, which fit
// it, must not be refused as one that can never fit.
func TestTooLargeUnderOldLimitsIsNotOversize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clk bubbleClock
		src := gateFirst(newAllocator(t, clk))
		l := newLimiter(t, clk, spender.WithLeases(src), spender.WithSpenderID("gw"), testTuning(time.Second))
		defer l.Close(ctx)
		halved, doubled := ration.Limits{TPM: 30_000}, ration.Limits{TPM: 60_000}
		small := ration.Amount{Requests: 1, Tokens: 10}

		var wg sync.WaitGroup
		wg.Go(func() { l.Reserve(ctx, "k", halved, small) }) // the first call, held at the gate
		synctest.Wait()
		var big error
		wg.Go(func() { _, big = l.Reserve(ctx, "k", doubled, ration.Amount{Requests: 1, Tokens: 40_001}) })
		synctest.Wait()
		wg.Go(func() { l.Reserve(ctx, "k", halved, small) }) // in flight with the old limits
		synctest.Wait()
		close(src.gate)
		wg.Wait()
		if errors.Is(big, spender.ErrExceedsCapacity) {
			t.Fatalf("a 40001-token request under a 60000 TPM limit was refused as too large: %v", big)
		}
	})
}
