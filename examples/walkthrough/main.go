// Command walkthrough runs the Limiter through the worked example and the wait-mode
// statement run of docs/contract.md on a virtual clock, printing every number,
// so what the limiter decides can be checked by hand.
//
//	go run ./examples/walkthrough
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/spender"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "walkthrough:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx := context.Background()
	clock := fakeclock.New()
	l, err := spender.New(clock)
	if err != nil {
		return err
	}

	fmt.Println("Worked example (docs/contract.md): key k with RPM 3 and TPM 1000, t = 0")
	lim := ration.Limits{RPM: 3, TPM: 1000}
	r, err := l.Reserve(ctx, "k", lim, ration.Amount{Requests: 1, Tokens: 300})
	if err != nil {
		return err
	}
	s := r.Status()
	fmt.Printf("  1. reserve 300 tokens: remaining %d requests, %d tokens, reset-tokens %v\n", s.RemainingRequests, s.RemainingTokens, s.ResetTokens)
	r.Settle(ration.Amount{Requests: 1, Tokens: 120})
	fmt.Println("  2. settle 120 used: 180 refunded")
	_, err = l.Reserve(ctx, "k", lim, ration.Amount{Requests: 1, Tokens: 900})
	var rej *spender.RejectError
	if !errors.As(err, &rej) {
		return fmt.Errorf("step 3 was admitted: %v", err)
	}
	fmt.Printf("  3. 900 tokens: 429, wait %v, Retry-After: %d, remaining tokens %d\n", rej.RetryAfter, spender.RetryAfterSeconds(rej.RetryAfter), rej.Status.RemainingTokens)
	clock.Advance(rej.RetryAfter)
	r, err = l.Reserve(ctx, "k", lim, ration.Amount{Requests: 1, Tokens: 900})
	if err != nil {
		return err
	}
	s = r.Status()
	fmt.Printf("  4. at t = 1.2s: admitted, remaining %d requests, %d tokens\n\n", s.RemainingRequests, s.RemainingTokens)

	fmt.Println("Wait mode (docs/contract.md): 80 statements at 16:00, bucket of 10 refilled one per 2 s, max wait 300 s")
	vendor := ration.Limits{RPM: 30, BurstRequests: 10}
	start := clock.Now()
	var last time.Duration
	now := 0
	for range 80 {
		_, at, err := l.ReserveAt(ctx, "vendor", vendor, ration.Amount{Requests: 1}, 300*time.Second)
		if err != nil {
			return err
		}
		if at.Sub(start) == 0 {
			now++
		}
		last = at.Sub(start)
	}
	fmt.Printf("  %d sent at once, the 80th at +%v, no 429s\n", now, last)
	return nil
}
