package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rationhq/ration/gateway"
)

// TestReloadUnderLoad: clients hammer one key through the demo (two
// instances, leased from the embedded allocator) while the keys file
// halves its limits and then doubles them back: RPM 300 until the first
// minute's budget is spent and one second more, 150 for 5 s, 300 for 4 s.
//
//   - The first request after each swap is judged under the new limits: a
//     request of 40 001 tokens fits the key's TPM capacity of 60 000, and
//     right after the halving to 30 000 it is refused at once as one that
//     can never fit (429 without Retry-After) on every instance; right
//     after the doubling it fits again.
//
//   - The over-admission bound holds across the changes. docs/bound.md
//     proves it from the potential Φ = L + h (the allocator's bucket level
//     plus what the spenders may still admit from their leases): refill
//     adds at most ρ·dτ, every admission takes its cost out, grants and
//     returns move units without adding any; a limit change adds nothing
//     either (the level is kept, capped at the new capacity: no budget is
//     minted, and leases stay). So, for the admissions A in any window
//     (a, b], each request costing exactly one,
//
//     A(a, b] ≤ Φ(a) + ∫ₐᵇ ρ(τ) dτ + D
//
//     with D the fallback admissions (debt; expected 0). The window's
//     start holds at most one burst: Φ(a) ≤ K = C + ρ·TTL under the limits
//     in force before a (the cap, fact (ii) of docs/bound.md), and Φ(0) =
//     C₀ for a key new to the allocator, as here. For phase p (rate ρₚ,
//     lasting tₚ) this gives
//
//     Aₚ ≤ min(Kₚ₋₁, carryₚ) + ρₚ·tₚ + slackₚ + D
//
//     where carryₚ = C₀ + Σ_{i<p} (ρᵢ·tᵢ + slackᵢ) − A_{<p} is what the
//     earlier phases left of the allowance (carry₀ = C₀), so the per-phase
//     checks add up to the whole run's, A(0, e] ≤ C₀ + ∫ρ + slack + D; and
//     slackₚ = max(0, ρₚ₋₁ − ρₚ)·(reload + lag) covers the allocator
//     refilling at the old rate until the first call with the new limits
//     reaches it (lag: 1 s allowed; under this load it is milliseconds).
//     Had the halving not taken effect, phase 1 would admit ρ₀·t₁ = 25 on
//     top of its carry, 10 over its bound.
//
//   - Each phase after a change admits at least 70% of ρₚ·tₚ: the key kept
//     its leases and is served at its new rate.
//
// A request counts in the phase in which its answer arrived: it was
// admitted at or before then, so the counts up to any instant never
// exceed the admissions up to it.
func TestReloadUnderLoad(t *testing.T) {
	const (
		tick     = 5 * time.Millisecond // one request per tick: 200/s offered (on 2 CPUs under -race, 100 to 200/s get through)
		workers  = 24
		lag      = time.Second // the allocator follows new limits within this (see slack above)
		probeTok = 40_000      // max_tokens of the probe: 40 001 tokens with its one-word prompt
		ttl      = 2 * time.Second
	)
	type phase struct {
		rpm, tpm int64
		d        time.Duration
	}
	phases := []phase{
		{300, 60_000, time.Second},     // until the first minute's 300 are spent (the first 429), then 5/s for this long
		{150, 30_000, 5 * time.Second}, // halved: 2.5/s
		{300, 60_000, 4 * time.Second}, // doubled back: 5/s
	}
	key := func(p phase) []gateway.Key {
		return []gateway.Key{{Key: "sk-hot", ID: "hot", Tenant: "t", RPM: p.rpm, TPM: p.tpm}}
	}
	path := writeKeys(t, key(phases[0]))
	cfg := testConfig(t, 2, path)
	cfg.leaseTTL, cfg.keysReload = ttl, 0 // reloads happen when the test says
	f := startFleet(t, cfg, nil)

	type answer struct {
		end    time.Time
		status int
	}
	var (
		mu        sync.Mutex
		answers   []answer
		firstBusy time.Time // the first 429: the first minute's budget is spent
	)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	t.Cleanup(client.CloseIdleConnections)
	// do sends one chat with maxTokens to instance i and records the answer.
	do := func(i, maxTokens int) (int, http.Header, string) {
		req, _ := http.NewRequest(http.MethodPost, f.instances[i].url+"/v1/chat/completions",
			strings.NewReader(fmt.Sprintf(`{"model":"echo","max_tokens":%d,"messages":[{"role":"user","content":"hot"}]}`, maxTokens)))
		req.Header.Set("Authorization", "Bearer sk-hot")
		req.Header.Set("Content-Type", "application/json")
		st, body, h := -1, "", http.Header(nil)
		if resp, err := client.Do(req); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			st, body, h = resp.StatusCode, string(b), resp.Header
		}
		mu.Lock()
		answers = append(answers, answer{time.Now(), st})
		if st == http.StatusTooManyRequests && firstBusy.IsZero() {
			firstBusy = time.Now()
		}
		mu.Unlock()
		return st, h, body
	}
	// probe checks, on every instance, whether a 40 001-token request is
	// refused as one that can never fit.
	probe := func(when string, wantOversize bool) {
		for i := range f.instances {
			st, h, body := do(i, probeTok)
			oversize := st == http.StatusTooManyRequests && h.Get("Retry-After") == "" && strings.Contains(body, "can never be admitted")
			if oversize != wantOversize || (st != http.StatusOK && st != http.StatusTooManyRequests) {
				t.Errorf("%s, instance %d: %d Retry-After %q %s; want oversize %v", when, i+1, st, h.Get("Retry-After"), body, wantOversize)
			}
		}
	}

	jobs := make(chan int, 64)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				do(i, 1)
			}
		})
	}
	stopLoad := make(chan struct{})
	loadDone := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(loadDone)
		tk := time.NewTicker(tick)
		defer tk.Stop()
		for n := 0; ; n++ {
			select {
			case <-stopLoad:
				return
			case <-tk.C:
				jobs <- n % len(f.instances)
			}
		}
	}()

	// swaps[p] is when phase p's limits came into force: between the
	// reload's call (from) and its return (to).
	type swap struct{ from, to time.Time }
	swaps := []swap{{start, start}}
	eventually(t, 30*time.Second, "the load spent the key's first minute (a 429)", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !firstBusy.IsZero()
	})
	for p := 1; p < len(phases); p++ {
		if p == 1 {
			mu.Lock()
			busy := firstBusy
			mu.Unlock()
			time.Sleep(time.Until(busy.Add(phases[0].d)))
			probe("just before the halving", false)
		} else {
			time.Sleep(time.Until(swaps[p-1].to.Add(phases[p-1].d)))
		}
		rewriteKeys(t, path, key(phases[p]))
		from := time.Now()
		if _, err := f.reloader.Reload(); err != nil {
			t.Fatal(err)
		}
		swaps = append(swaps, swap{from, time.Now()})
		probe(fmt.Sprintf("first request after the swap to %d RPM / %d TPM", phases[p].rpm, phases[p].tpm), phases[p].tpm < probeTok)
	}
	time.Sleep(time.Until(swaps[len(swaps)-1].to.Add(phases[len(phases)-1].d)))
	close(stopLoad)
	<-loadDone
	close(jobs)
	wg.Wait()
	end := time.Now()

	var fallback float64 // D: admissions on the fallback policy, reported as debt
	for i, inst := range f.instances {
		fallback += metricValue(t, inst.reg, "ration_spender_admitted_total", "path=fallback")
		if n := metricValue(t, inst.reg, "ration_spender_lease_calls_total", "method=Release"); n != 0 {
			t.Errorf("instance %d made %.0f Release calls: a limit change must not give leases back", i+1, n)
		}
	}
	bounds := make([]time.Time, len(phases)+1) // phase p ends at bounds[p+1]
	for p := range phases {
		bounds[p] = swaps[p].to
	}
	bounds[0], bounds[len(phases)] = start, end
	admitted := make([]int, len(phases))
	other := 0
	for _, a := range answers {
		switch a.status {
		case http.StatusOK:
			p := 0
			for p+1 < len(phases) && a.end.After(bounds[p+1]) {
				p++
			}
			admitted[p]++
		case http.StatusTooManyRequests:
		default:
			other++
		}
	}
	if other > 0 {
		t.Errorf("%d answers neither 200 nor 429", other)
	}

	var table strings.Builder
	fmt.Fprintf(&table, "phase  RPM  duration  admitted  rate/s  allowed=min(K,carry)+ρt+slack+D  min(K,carry)  70%% of ρt\n")
	carry := float64(phases[0].rpm) // C₀: the key is new to the allocator
	for p, ph := range phases {
		rate := float64(ph.rpm) / 60
		secs := bounds[p+1].Sub(bounds[p]).Seconds()
		refill := rate * secs
		slack := 0.0
		if p > 0 {
			prev := float64(phases[p-1].rpm) / 60
			// The old rate may run on from the reload's call until the
			// allocator has the new limits.
			slack = max(0, prev-rate)*(bounds[p].Sub(swaps[p].from)+lag).Seconds() + max(0, rate-prev)*swaps[p].to.Sub(swaps[p].from).Seconds()
		}
		burst := carry
		if p > 0 {
			prevRate := float64(phases[p-1].rpm) / 60
			burst = min(carry, float64(phases[p-1].rpm)+prevRate*ttl.Seconds()) // K of the limits before the swap
		}
		allowed := burst + refill + slack + fallback
		fmt.Fprintf(&table, "%5d  %3d  %7.2fs  %8d  %6.2f  %31.1f  %12.1f  %9.1f\n", p, ph.rpm, secs, admitted[p], float64(admitted[p])/secs, allowed, burst, 0.7*refill)
		if float64(admitted[p]) > allowed+1 { // +1: a partial unit of refill rounds to a whole request
			t.Errorf("phase %d: admitted %d, above the bound %.1f", p, admitted[p], allowed)
		}
		if p > 0 && float64(admitted[p]) < 0.7*refill {
			t.Errorf("phase %d: admitted %d, below 70%% of the %.1f its rate allows", p, admitted[p], refill)
		}
		carry = carry + refill + slack - float64(admitted[p])
	}
	fmt.Fprintf(&table, "answers %d, fallback admissions (D) %.0f, lease TTL %v", len(answers), fallback, ttl)
	t.Log("\n" + table.String())
}
