package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/gateway"
	"github.com/rationhq/ration/internal/testkit"
)

// startAllocator serves a real allocator (bbolt ledger in a temp dir) over
// h2c on a loopback port, with bearer auth, as cmd/allocator does. It
// returns its URL and a token file.
func startAllocator(t *testing.T, ttl time.Duration) (url, tokenFile string) {
	t.Helper()
	url, tokenFile, _ = startLedger(t, ttl)
	return url, tokenFile
}

// startLedger is startAllocator, also returning its ledger; the service
// gets opts.
func startLedger(t *testing.T, ttl time.Duration, opts ...allocator.ServiceOption) (url, tokenFile string, led *allocator.Ledger) {
	t.Helper()
	dir := t.TempDir()
	led, err := allocator.Open(filepath.Join(dir, "allocator.db"), allocator.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	tokenFile = filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("# allocator token\ntest-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // last: after the server, and the fleet (registered later) returned its leases
		if err := led.Close(); err != nil {
			t.Errorf("closing the ledger: %v", err)
		}
	})
	mux := http.NewServeMux()
	allocator.Mount(mux, allocator.NewService(led, opts...), allocator.BearerAuth([]string{"test-token"}, nil))
	return testkit.H2C(t, mux), tokenFile, led
}

// TestSkewedTrafficSharesOneBudget is the end-to-end check over real HTTP
// on loopback: one allocator, three gateway instances, and one key's
// traffic split 80/15/5 across them at many times its limit for a bounded
// time. Every answer is 200 or 429 (no 5xx), and the total admitted is
// within the documented bound C + ρ·(t + TTL) and at least 95% of what
// the limit allows, C + ρ·t.
func TestSkewedTrafficSharesOneBudget(t *testing.T) {
	const (
		rpm      = 300                   // C = 300 requests, ρ = 5 per second
		ttl      = 2 * time.Second       // the allocator's lease TTL
		duration = 6 * time.Second       // how long traffic is offered
		tick     = 10 * time.Millisecond // one request per tick: 100/s offered, 20× ρ
		workers  = 48                    // client concurrency
		timeout  = 10 * time.Second      // per request
	)
	weights := []int{16, 3, 1} // of every 20 requests: 80%, 15%, 5%

	allocURL, tokenFile := startAllocator(t, ttl)
	keys := writeKeys(t, []gateway.Key{{Key: "sk-skew", ID: "skew", Tenant: "t", RPM: rpm}})
	cfg := testConfig(t, 3, keys)
	cfg.allocatorURL, cfg.tokenFile = allocURL, tokenFile
	f := startFleet(t, cfg, nil)

	type result struct{ inst, status int }
	jobs := make(chan int, 1024)
	results := make(chan result, 1024)
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for inst := range jobs {
				req, _ := http.NewRequest(http.MethodPost, f.instances[inst].url+"/v1/chat/completions",
					strings.NewReader(`{"model":"echo","max_tokens":1,"messages":[{"role":"user","content":"skew"}]}`))
				req.Header.Set("Authorization", "Bearer sk-skew")
				req.Header.Set("Content-Type", "application/json")
				st := -1
				if resp, err := client.Do(req); err == nil {
					st = resp.StatusCode
					resp.Body.Close()
				}
				results <- result{inst, st}
			}
		})
	}
	var offered [3]int
	collected := make(chan [3]map[int]int)
	go func() {
		var by [3]map[int]int
		for i := range by {
			by[i] = map[int]int{}
		}
		for r := range results {
			by[r.inst][r.status]++
		}
		collected <- by
	}()

	start := time.Now()
	tk := time.NewTicker(tick)
	for n := 0; time.Since(start) < duration; n++ {
		<-tk.C
		inst, slot := 0, n%20
		for slot >= weights[inst] {
			slot -= weights[inst]
			inst++
		}
		offered[inst]++
		jobs <- inst
	}
	tk.Stop()
	close(jobs)
	wg.Wait()
	elapsed := time.Since(start)
	close(results)
	by := <-collected

	admitted, total := 0, 0
	var table strings.Builder
	fmt.Fprintf(&table, "instance  share  offered  admitted  429  other  admitted/offered\n")
	for i := range by {
		other := 0
		for st, n := range by[i] {
			if st != 200 && st != 429 {
				other += n
				t.Errorf("instance %d: %d answers with status %d", i+1, n, st)
			}
		}
		admitted += by[i][200]
		total += offered[i]
		fmt.Fprintf(&table, "%8d  %4d%%  %7d  %8d  %3d  %5d  %16.2f\n", i+1, weights[i]*5, offered[i], by[i][200], by[i][429], other,
			float64(by[i][200])/float64(max(offered[i], 1)))
	}
	rate := float64(rpm) / 60 // ρ, requests per second
	allows := float64(rpm) + rate*duration.Seconds()
	bound := float64(rpm) + rate*(elapsed+ttl).Seconds()
	fmt.Fprintf(&table, "total offered %d in %v; admitted %d; the limit allows C+ρt = %.0f (95%%: %.1f); bound C+ρ(t+TTL) = %.1f",
		total, elapsed.Round(time.Millisecond), admitted, allows, 0.95*allows, bound)
	t.Log("\n" + table.String())
	if float64(admitted) > bound {
		t.Errorf("admitted %d, above the bound %.1f", admitted, bound)
	}
	if float64(admitted) < 0.95*allows {
		t.Errorf("admitted %d, below 95%% of the %.0f the limit allows", admitted, allows)
	}
}
