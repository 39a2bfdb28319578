//go:build faults

package faults

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSlowBodiesAreCut opens 200 connections to a gateway run with
// -read-timeout 2s that send a request's head declaring 1000 bytes and
// then dribble its body, a byte every 200 ms: half with a valid key, half
// without. Each is cut within the read timeout plus 1.5 s: with a key, 408
// or closed; without, 401 at once and closed by then. Meanwhile a normal
// request every 100 ms is answered 200 within a second, and the gateway
// admits (charges) only those: a body that never arrived costs nothing.
func TestSlowBodiesAreCut(t *testing.T) {
	const (
		n           = 200
		readTimeout = 2 * time.Second
		slack       = 1500 * time.Millisecond
		prompt      = time.Second // "promptly": the normal requests' latency cap
		ttl         = 2 * time.Second
	)
	needFDs(t, n+64)
	ctx := deadline(t, 30*time.Second)
	k := key{Key: "sk-faults-slow", ID: "faults-slow", Tenant: "faults", RPM: 600}
	gw := startGateway(ctx, t, "gateway", gatewaySpec{instances: 1, ttl: ttl, keysFile: writeKeys(t, k),
		extra: []string{"-read-timeout", readTimeout.String()}})
	addr := strings.TrimPrefix(gw.urls[0], "http://")

	// The normal requests: one every 100 ms, timed, until every slow body
	// is done (10 a second, the key's refill rate, from a full bucket:
	// never refused).
	var (
		latencies []time.Duration
		answered  = map[int]int{}
	)
	slowDone, normalDone := make(chan struct{}), make(chan struct{})
	began := time.Now()
	go func() {
		defer close(normalDone)
		client := newLoadClient(1)
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			start := time.Now()
			code, _ := sendChat(ctx, client, gw.urls[0], k.Key)
			latencies = append(latencies, time.Since(start))
			answered[code]++
			select {
			case <-slowDone:
				return
			case <-ctx.Done():
				return
			case <-tk.C:
			}
		}
	}()

	results := make([]slowConn, n)
	var wg sync.WaitGroup
	for i := range n {
		auth := ""
		if i%2 == 0 {
			auth = bearer(k.Key)
		}
		wg.Go(func() {
			results[i] = slowBody(ctx, addr, declaredHead(auth, 1000), 200*time.Millisecond, readTimeout+slack)
		})
	}
	wg.Wait()
	close(slowDone)
	<-normalDone
	res := loadResult{elapsed: time.Since(began), byTarget: []map[int]int{answered}}

	for _, withKey := range []bool{true, false} {
		name := "with a valid key"
		if !withKey {
			name = "without a key"
		}
		counts := map[int]int{}
		var cut []time.Duration
		for i, r := range results {
			if (i%2 == 0) != withKey {
				continue
			}
			counts[r.status]++
			cut = append(cut, r.closed)
			if r.err != nil {
				t.Errorf("connection %d (%s): %v", i, name, r.err)
				continue
			}
			ok := r.status == http.StatusRequestTimeout || r.status == 0
			if !withKey {
				ok = r.status == http.StatusUnauthorized || r.status == http.StatusRequestTimeout || r.status == 0
			}
			if !ok {
				t.Errorf("connection %d (%s): status %d", i, name, r.status)
			}
		}
		t.Logf("%d slow bodies %s: %s; all closed within %v of their head (read timeout %v)",
			len(cut), name, describe(counts), longest(cut).Round(time.Millisecond), readTimeout)
	}
	worst := longest(latencies)
	t.Logf("normal requests meanwhile: %v, the slowest in %v", res, worst.Round(time.Millisecond))
	if worst > prompt {
		t.Errorf("a normal request took %v while slow bodies were held; want under %v", worst, prompt)
	}
	if res.count(http.StatusOK) != res.total() {
		t.Errorf("normal requests meanwhile: %v; want every one 200", res)
	}
	gc := mustReadGateways(ctx, t, gw.urls)
	b := checkBound(t, run{rpm: k.RPM, ttl: ttl, clients: res, gw: gc})
	if b.admitted != b.clientOK {
		t.Errorf("the gateway admitted %.0f requests; only the %.0f normal ones had a body", b.admitted, b.clientOK)
	}
	gw.alive(t)
}
