package spenderhttp_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/spender"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// TestMiddlewareOnLeasedLimiter: the stage works unchanged on a Limiter
// that spends leases from an allocator: headers on every 200, the third
// request at RPM 2 is a 429 with Retry-After 30, and settlement reaches the
// budget.
func TestMiddlewareOnLeasedLimiter(t *testing.T) {
	clk := newClock()
	led, err := allocator.New(allocator.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer led.Close()
	lim := newLimiter(t, clk, spender.WithLeases(allocator.NewService(led)))
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		lim.Close(ctx)
	}()
	p := spenderhttp.Principal{KeyID: "k1", Tenant: "t", Limits: ration.Limits{RPM: 2, TPM: 100000}}
	h := authed(p, spenderhttp.Middleware(lim, nil)(jsonHandler(200, `{"usage":{"total_tokens":5}}`)))
	for i, want := range []string{"1", "0"} {
		w := do(h, chat(`"max_tokens":10`))
		if w.Code != 200 || w.Header().Get("x-ratelimit-remaining-requests") != want {
			t.Fatalf("request %d: %d, remaining-requests %q; want 200 and %s", i+1, w.Code, w.Header().Get("x-ratelimit-remaining-requests"), want)
		}
		for _, name := range fiveHeaders {
			if w.Header().Get(name) == "" {
				t.Errorf("request %d: no %s header", i+1, name)
			}
		}
	}
	w := do(h, chat(`"max_tokens":10`))
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "30" {
		t.Fatalf("third request: %d with Retry-After %q; want 429 and 30", w.Code, w.Header().Get("Retry-After"))
	}
	// Half a minute later one request has refilled globally and is granted.
	clk.Advance(30 * time.Second)
	w = do(h, chat(`"max_tokens":10`))
	if w.Code != 200 {
		t.Fatalf("after 30 s: %d, want 200", w.Code)
	}
}
