//go:build faults

package faults

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDeclaredBodiesDoNotTakeMemory opens 40 connections to a gateway
// (run with -read-timeout 5s) that each declare Content-Length: 16000000
// with a valid key and send no body. Once all 40 are in the gateway's
// handler (ration_gateway_in_flight), the process's resident memory
// (VmRSS in /proc/PID/status, sampled for a second, and VmHWM, its peak
// since start) stays under 100 MB: a body is read as it arrives, never
// sized from its declared length. Each is then answered 408 (or closed)
// after the read timeout, and none is admitted.
func TestDeclaredBodiesDoNotTakeMemory(t *testing.T) {
	const (
		n           = 40
		declared    = 16_000_000
		readTimeout = 5 * time.Second
		slack       = 1500 * time.Millisecond
		limitKB     = 100 << 10 // 100 MB
	)
	ctx := deadline(t, 30*time.Second)
	k := key{Key: "sk-faults-memory", ID: "faults-memory", Tenant: "faults", RPM: 600}
	gw := startGateway(ctx, t, "gateway", gatewaySpec{instances: 1, ttl: 2 * time.Second, keysFile: writeKeys(t, k),
		extra: []string{"-read-timeout", readTimeout.String()}})
	pid := gw.pid()
	before := statusKB(t, pid, "VmRSS")

	results := make([]slowConn, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			// A tick longer than the wait: no byte of the body is ever sent.
			results[i] = slowBody(ctx, strings.TrimPrefix(gw.urls[0], "http://"), declaredHead(bearer(k.Key), declared),
				time.Hour, readTimeout+slack)
		})
	}
	var inFlight float64
	err := poll(ctx, 20*time.Millisecond, func() (bool, error) {
		c, err := readGateways(ctx, gw.urls)
		inFlight = c.inFlight
		return err == nil && inFlight >= n, err
	})
	if err != nil {
		t.Fatalf("only %.0f of %d requests reached the gateway's handler: %v", inFlight, n, err)
	}
	var peak int64
	for range 20 { // a second of samples while every request waits for its body
		peak = max(peak, statusKB(t, pid, "VmRSS"))
		pause(ctx, 50*time.Millisecond)
	}
	hwm := statusKB(t, pid, "VmHWM")
	t.Logf("VmRSS %d KiB before; with %d bodies of %d bytes declared: VmRSS up to %d KiB, VmHWM %d KiB",
		before, n, declared, peak, hwm)
	if peak >= limitKB || hwm >= limitKB {
		t.Errorf("the gateway's resident memory reached %d KiB (VmHWM %d KiB); want under 100 MB", peak, hwm)
	}

	wg.Wait()
	counts := map[int]int{}
	var cut []time.Duration
	for i, r := range results {
		counts[r.status]++
		cut = append(cut, r.closed)
		if r.err != nil {
			t.Errorf("connection %d: %v", i, r.err)
		} else if r.status != http.StatusRequestTimeout && r.status != 0 {
			t.Errorf("connection %d: status %d, want 408 or a close", i, r.status)
		}
	}
	t.Logf("then: %s, all closed within %v of their head (read timeout %v)", describe(counts), longest(cut).Round(time.Millisecond), readTimeout)
	if c := mustReadGateways(ctx, t, gw.urls); c.admitted != 0 {
		t.Errorf("the gateway admitted %.0f requests whose body never came", c.admitted)
	}
	gw.alive(t)
}

// engineLine is the demo's banner line naming its engine's URL.
var engineLine = regexp.MustCompile(`engine +(http://\S+) +echo`)

// TestRealBodiesStayWithinTheCap opens 40 connections to a gateway
// (-max-body-in-flight 256 MiB, proxying to the echo engine of another
// demo process, as a gateway proxies to an engine of its own) that each
// send a 16 MB chat request, a prompt of that many bytes, at once, with a
// key whose limits admit them all. The gateway's resident memory (VmRSS
// sampled every 50 ms while they run, and VmHWM) must stay within 1.5
// times the in-flight cap plus the process's resident memory before.
// Every request is answered 200 or, past the cap, 503. The engine's
// process, whose echo engine parses and counts each prompt, is measured
// too, for the log.
func TestRealBodiesStayWithinTheCap(t *testing.T) {
	const (
		n      = 40
		size   = 16_000_000
		capMiB = 256
	)
	ctx := deadline(t, 90*time.Second)
	k := key{Key: "sk-faults-bodies", ID: "faults-bodies", Tenant: "faults", RPM: 6000}
	keys := writeKeys(t, k)
	eng := startGateway(ctx, t, "engine", gatewaySpec{instances: 1, ttl: 2 * time.Second, keysFile: keys})
	m := engineLine.FindStringSubmatch(eng.logs.String())
	if m == nil {
		t.Fatalf("the engine process's banner names no echo engine:\n%s", eng.logs.tail(4<<10))
	}
	gw := startGateway(ctx, t, "gateway", gatewaySpec{instances: 1, ttl: 2 * time.Second, keysFile: keys,
		extra: []string{"-max-body-in-flight", fmt.Sprint(capMiB << 20), "-upstream", m[1]}})
	pid := gw.pid()
	before := statusKB(t, pid, "VmRSS")
	// One prompt of words, as a client's text is.
	prompt := strings.Repeat("lorem ipsu ", size/11)
	body := []byte(`{"model":"echo","max_tokens":1,"messages":[{"role":"user","content":"` + prompt + `"}]}`)
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxConnsPerHost: n, MaxIdleConnsPerHost: n}}
	codes := make([]int, n)
	var wg sync.WaitGroup
	done := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, gw.urls[0]+"/v1/chat/completions", bytes.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set("Authorization", "Bearer "+k.Key)
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[i] = resp.StatusCode
		})
	}
	go func() { wg.Wait(); close(done) }()
	var peak int64
	for sampling := true; sampling; {
		select {
		case <-done:
			sampling = false
		case <-time.After(50 * time.Millisecond):
		}
		peak = max(peak, statusKB(t, pid, "VmRSS"))
	}
	hwm := statusKB(t, pid, "VmHWM")
	limitKB := int64(capMiB<<10)*3/2 + before
	counts := map[int]int{}
	for _, c := range codes {
		counts[c]++
	}
	t.Logf("gateway: VmRSS %d KiB before; %d requests of %d bytes at once: %s; VmRSS up to %d KiB, VmHWM %d KiB (limit 1.5 x %d MiB + before = %d KiB); the engine's process: VmHWM %d KiB",
		before, n, len(body), describe(counts), peak, hwm, capMiB, limitKB, statusKB(t, eng.pid(), "VmHWM"))
	if peak > limitKB || hwm > limitKB {
		t.Errorf("the gateway's resident memory reached %d KiB (VmHWM %d KiB), above %d KiB", peak, hwm, limitKB)
	}
	for code, c := range counts {
		if code != http.StatusOK && code != http.StatusServiceUnavailable {
			t.Errorf("%d requests answered %d, want 200 or 503", c, code)
		}
	}
	if counts[http.StatusOK] == 0 {
		t.Error("no request was admitted")
	}
	gw.alive(t)
}
