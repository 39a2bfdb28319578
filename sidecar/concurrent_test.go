package sidecar_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/internal/testkit"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	sidecarv1 "github.com/rationhq/ration/proto/ration/sidecar/v1"
	"github.com/rationhq/ration/sidecar"
)

// TestConcurrentNothingMinted: many callers reserve, settle, cancel and
// abandon reservations at once (under -race). With the clock standing
// still nothing refills, so afterwards the budget holds exactly its
// capacity minus what was charged: the usage of the settled, nothing for
// the cancelled, the reserved cost of those left open (settled at it on
// Close). Nothing is minted or lost, and nothing stays held.
func TestConcurrentNothingMinted(t *testing.T) {
	const capacity = 1_000_000
	clk := fakeclock.New()
	svc, err := sidecar.New(testkit.Limiter(t, clk), sidecar.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	limits := &leasev1.Limits{Rpm: capacity, Tpm: capacity}
	var charged atomic.Int64 // tokens
	var requests atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 200 {
				cost := rng.Int64N(500)
				r, err := svc.Reserve(ctx, &sidecarv1.ReserveRequest{Charges: []*sidecarv1.Charge{{Key: "k", Limits: limits,
					Cost: &leasev1.Amount{Requests: 1, Tokens: cost}}}})
				if err != nil || r.Decision != sidecarv1.Decision_DECISION_ADMITTED {
					t.Error(r, err)
					return
				}
				switch rng.IntN(3) {
				case 0:
					used := rng.Int64N(1000)
					if _, err := svc.Settle(ctx, &sidecarv1.SettleRequest{ReservationId: r.ReservationId,
						Usage: []*leasev1.Amount{{Requests: 1, Tokens: used}}}); err != nil {
						t.Error(err)
					}
					charged.Add(used)
					requests.Add(1)
				case 1:
					if _, err := svc.Cancel(ctx, &sidecarv1.CancelRequest{ReservationId: r.ReservationId}); err != nil {
						t.Error(err)
					}
				default: // abandoned: settled at its reserved cost by Close
					charged.Add(cost)
					requests.Add(1)
				}
			}
		})
	}
	wg.Wait()
	svc.Close()
	if svc.Open() != 0 {
		t.Fatalf("open = %d after Close", svc.Open())
	}
	r, err := svc.Reserve(ctx, &sidecarv1.ReserveRequest{Charges: []*sidecarv1.Charge{{Key: "k", Limits: limits, Cost: &leasev1.Amount{}}}})
	if err != nil {
		t.Fatal(err)
	}
	wantTok, wantReq := capacity-charged.Load(), capacity-requests.Load()
	if got := r.Headers["X-Ratelimit-Remaining-Tokens"]; got != itoa(wantTok) {
		t.Errorf("tokens left %s, want %d", got, wantTok)
	}
	if got := r.Headers["X-Ratelimit-Remaining-Requests"]; got != itoa(wantReq) {
		t.Errorf("requests left %s, want %d", got, wantReq)
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }
