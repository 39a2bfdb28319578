package spender_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/spender"
)

// The contract's worked example (docs/contract.md): reserve an estimate, settle the actual
// usage, and tell a client exactly when to come back.
func ExampleLimiter_Reserve() {
	clock := fakeclock.New() // ration.SystemClock{} in production
	l, err := spender.New(clock)
	if err != nil {
		panic(err)
	}
	lim := ration.Limits{RPM: 3, TPM: 1000}

	r, err := l.Reserve(context.Background(), "key-1", lim, ration.Amount{Requests: 1, Tokens: 300})
	if err != nil {
		panic(err)
	}
	s := r.Status()
	fmt.Println("remaining:", s.RemainingRequests, "requests,", s.RemainingTokens, "tokens; full again in", s.ResetTokens)
	r.Settle(ration.Amount{Requests: 1, Tokens: 120}) // 180 unused tokens come back

	_, err = l.Reserve(context.Background(), "key-1", lim, ration.Amount{Requests: 1, Tokens: 900})
	var rej *spender.RejectError
	if errors.As(err, &rej) {
		fmt.Println("rejected: wait", rej.RetryAfter, "so Retry-After:", spender.RetryAfterSeconds(rej.RetryAfter))
	}
	// Output:
	// remaining: 2 requests, 700 tokens; full again in 18s
	// rejected: wait 1.2s so Retry-After: 2
}

// Wait mode: ten statements go at once, then one every 2 seconds; a caller
// that cannot wait long enough is refused and reserves nothing.
func ExampleLimiter_ReserveAt() {
	clock := fakeclock.New()
	l, err := spender.New(clock)
	if err != nil {
		panic(err)
	}
	lim := ration.Limits{RPM: 30, BurstRequests: 10} // 10 at once, then one per 2 s
	for i := range 13 {
		_, at, err := l.ReserveAt(context.Background(), "vendor", lim, ration.Amount{Requests: 1}, 5*time.Second)
		if err != nil {
			fmt.Printf("call %d: %v\n", i+1, err)
			continue
		}
		if d := at.Sub(clock.Now()); d > 0 {
			fmt.Printf("call %d: send in %v\n", i+1, d)
		}
	}
	// Output:
	// call 11: send in 2s
	// call 12: send in 4s
	// call 13: spender: rate limited on requests: 1 requested, 0 remaining; retry after 6s
}

// A Limiter on leases: the same calls, with the key's budget held by an
// allocator (here in process; spender.DialAllocator reaches a remote one)
// and shared by every Limiter that leases from it.
func ExampleWithLeases() {
	clock := fakeclock.New()
	ledger, err := allocator.New(allocator.WithClock(clock))
	if err != nil {
		panic(err)
	}
	defer ledger.Close()
	gw1, err := spender.New(clock, spender.WithLeases(allocator.NewService(ledger)), spender.WithSpenderID("gw-1"))
	if err != nil {
		panic(err)
	}
	gw2, err := spender.New(clock, spender.WithLeases(allocator.NewService(ledger)), spender.WithSpenderID("gw-2"))
	if err != nil {
		panic(err)
	}
	defer gw1.Close(context.Background())
	defer gw2.Close(context.Background())

	lim := ration.Limits{RPM: 3, TPM: 1000} // 3 requests a minute across both gateways
	for i, gw := range []*spender.Limiter{gw1, gw2, gw2, gw1} {
		_, err := gw.Reserve(context.Background(), "key-1", lim, ration.Amount{Requests: 1, Tokens: 100})
		var rej *spender.RejectError
		if errors.As(err, &rej) {
			fmt.Printf("request %d: rejected, retry after %v\n", i+1, rej.RetryAfter)
			continue
		}
		fmt.Printf("request %d: admitted\n", i+1)
	}
	// Output:
	// request 1: admitted
	// request 2: admitted
	// request 3: admitted
	// request 4: rejected, retry after 20s
}
