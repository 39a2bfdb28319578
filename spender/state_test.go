package spender_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/spender"
)

// TestIdleKeysAreDropped: a million distinct keys over simulated time do
// not accumulate. Each key spends once; its bucket is full again 1 s later
// (RPM 60) and its state is dropped at the next sweep.
func TestIdleKeysAreDropped(t *testing.T) {
	clk := fakeclock.New()
	l := newLimiter(t, clk, spender.WithSweepInterval(10*time.Second))
	lim := ration.Limits{RPM: 60, TPM: 6000}
	n := 1_000_000
	if testing.Short() {
		n = 100_000
	}
	const perStep = 1000 // keys per 10 ms of virtual time: 100k keys a second
	peak := 0
	for i := range n {
		if _, err := l.Reserve(ctx, "key-"+strconv.Itoa(i), lim, ration.Amount{Requests: 1, Tokens: 50}); err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
		if i%perStep == perStep-1 {
			clk.Advance(10 * time.Millisecond)
		}
		if i%50_000 == 0 {
			peak = max(peak, l.Keys())
		}
	}
	// Active within the last refill-to-full period (1 s = 100k keys) plus
	// the sweep interval (10 s = 1M keys) bounds it from above; the
	// doubling trigger keeps it far lower in practice.
	if peak > 400_000 {
		t.Fatalf("peak of %d keys held for %d distinct keys", peak, n)
	}
	clk.Advance(time.Minute)
	l.Reserve(ctx, "trigger", lim, ration.Amount{Requests: 1})
	// Every shard sweeps on its next call; touch them all.
	for i := range 100_000 {
		l.Reserve(ctx, "t"+strconv.Itoa(i), ration.Limits{RPM: 60}, ration.Amount{})
	}
	if k := l.Keys(); k > 100_001 {
		t.Fatalf("%d keys held a minute after the traffic stopped", k)
	}
	t.Logf("peak %d keys held for %d distinct keys", peak, n)
}

// TestDroppedStateSettlesExactly: a reservation whose key state was dropped
// (full again) still charges its overrun to the key.
func TestDroppedStateSettlesExactly(t *testing.T) {
	clk := fakeclock.New()
	l := newLimiter(t, clk, spender.WithShards(1), spender.WithSweepInterval(time.Second))
	lim := ration.Limits{TPM: 600}
	r := mustReserve(t, l, "k", lim, ration.Amount{Tokens: 100})
	clk.Advance(time.Minute)
	mustReserve(t, l, "other", lim, ration.Amount{}) // sweeps the one shard: "k" is full and dropped
	if l.Keys() != 1 {
		t.Fatalf("holding %d keys, want 1 (k dropped)", l.Keys())
	}
	r.Settle(ration.Amount{Tokens: 700}) // 600 over a full bucket: level 0
	if rej := mustReject(t, l, "k", lim, ration.Amount{Tokens: 10}); rej.RetryAfter != time.Second {
		t.Fatalf("RetryAfter = %v, want 1s", rej.RetryAfter)
	}
}

// TestLimitsChangeWithoutMinting: an admin edits a key's limits between
// calls; the bucket follows without minting tokens.
func TestLimitsChangeWithoutMinting(t *testing.T) {
	clk := fakeclock.New()
	l := newLimiter(t, clk)
	small := ration.Limits{RPM: 10, TPM: 1000}
	big := ration.Limits{RPM: 100, TPM: 100_000}
	mustReserve(t, l, "k", small, ration.Amount{Requests: 1, Tokens: 900}) // 100 left
	// Raising the limit keeps the level (100), it does not jump to 100000.
	r := mustReserve(t, l, "k", big, ration.Amount{Requests: 1, Tokens: 100})
	if s := r.Status(); s.RemainingTokens != 0 || s.LimitTokens != 100_000 || s.RemainingRequests != 8 {
		t.Fatalf("after raising: %+v, want 0 tokens and 8 requests left under the new limits", s)
	}
	// The new rate refills: 100000/min is 1000 per 600 ms.
	clk.Advance(600 * time.Millisecond)
	mustReserve(t, l, "k", big, ration.Amount{Tokens: 1000})
	// Lowering caps the level at the new capacity.
	clk.Advance(time.Hour)
	r = mustReserve(t, l, "k", small, ration.Amount{Requests: 1, Tokens: 1})
	if s := r.Status(); s.RemainingTokens != 999 || s.RemainingRequests != 9 {
		t.Fatalf("after lowering: %+v, want 999 tokens and 9 requests", s)
	}
	// Dropping the token limit makes that dimension unlimited.
	r = mustReserve(t, l, "k", ration.Limits{RPM: 10}, ration.Amount{Requests: 1, Tokens: 1 << 40})
	if s := r.Status(); s.LimitTokens != 0 || s.RemainingRequests != 8 {
		t.Fatalf("after removing TPM: %+v", s)
	}
	// Adding it back starts that bucket full.
	r = mustReserve(t, l, "k", small, ration.Amount{Tokens: 10})
	if s := r.Status(); s.RemainingTokens != 990 {
		t.Fatalf("after restoring TPM: %+v, want 990", s)
	}
}

// TestBadInputChangesNothing: each class of bad input gets its sentinel and
// leaves the key's budget untouched.
func TestBadInputChangesNothing(t *testing.T) {
	l := newLimiter(t, fakeclock.New())
	lim := ration.Limits{RPM: 10, TPM: 1000}
	for _, tc := range []struct {
		name string
		key  string
		lim  ration.Limits
		cost ration.Amount
		want error
	}{
		{"empty key", "", lim, ration.Amount{Requests: 1}, spender.ErrInvalidKey},
		{"long key", strings.Repeat("x", ration.MaxKeyLen+1), lim, ration.Amount{Requests: 1}, spender.ErrInvalidKey},
		{"negative tokens", "k", lim, ration.Amount{Requests: 1, Tokens: -5}, spender.ErrInvalidCost},
		{"negative requests", "k", lim, ration.Amount{Requests: -1}, spender.ErrInvalidCost},
		{"negative rpm", "k", ration.Limits{RPM: -1}, ration.Amount{Requests: 1}, ration.ErrInvalidLimits},
		{"negative burst", "k", ration.Limits{TPM: 10, BurstTokens: -1}, ration.Amount{}, ration.ErrInvalidLimits},
		{"negative burst unlimited", "k", ration.Limits{BurstTokens: -1}, ration.Amount{}, ration.ErrInvalidLimits},
		{"absurd tpm", "k", ration.Limits{TPM: 1 << 62}, ration.Amount{Tokens: 1}, ration.ErrInvalidLimits},
		{"absurd burst", "k", ration.Limits{TPM: 7, BurstTokens: 1 << 60}, ration.Amount{Tokens: 1}, ration.ErrInvalidLimits},
		{"rpm above the protocol's bound", "k", ration.Limits{RPM: ration.MaxRate + 1}, ration.Amount{Requests: 1}, ration.ErrInvalidLimits},
		{"key id not UTF-8", "raw\xffsha", lim, ration.Amount{Requests: 1}, spender.ErrInvalidKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, mode := range []string{"Reserve", "ReserveAt"} {
				var err error
				if mode == "Reserve" {
					_, err = l.Reserve(ctx, tc.key, tc.lim, tc.cost)
				} else {
					_, _, err = l.ReserveAt(ctx, tc.key, tc.lim, tc.cost, time.Minute)
				}
				if !errors.Is(err, tc.want) {
					t.Fatalf("%s = %v, want %v", mode, err, tc.want)
				}
				var rej *spender.RejectError
				if errors.As(err, &rej) {
					t.Fatalf("%s: bad input reported as a rejection: %v", mode, err)
				}
			}
			r := mustReserve(t, l, "k", lim, ration.Amount{})
			if s := r.Status(); s.RemainingRequests != 10 || s.RemainingTokens != 1000 {
				t.Fatalf("bad input changed the budget: %+v", s)
			}
		})
	}
	// A huge overrun saturates instead of overflowing.
	r := mustReserve(t, l, "huge", lim, ration.Amount{Requests: 1, Tokens: 10})
	r.Settle(ration.Amount{Requests: 1 << 62, Tokens: 1<<63 - 1})
	if rej := mustReject(t, l, "huge", lim, ration.Amount{Tokens: 1}); rej.RetryAfter <= 0 {
		t.Fatalf("after a saturating overrun: %+v", rej)
	}
}
