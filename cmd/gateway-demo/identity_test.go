package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/gateway"
	"github.com/rationhq/ration/internal/testkit"
)

func TestDefaultSpenderPrefixIsUniqueAndValid(t *testing.T) {
	a, b := defaultSpenderPrefix(), defaultSpenderPrefix()
	if a == b {
		t.Errorf("two default prefixes are both %q: two processes could share spender ids", a)
	}
	for _, p := range []string{a, b} {
		if err := ration.ValidSpenderID(spenderID(p, maxInstances-1)); err != nil {
			t.Errorf("%q: %v", p, err)
		}
	}
}

func TestParseConfigSpenderID(t *testing.T) {
	env := map[string]string{"RATION_DEMO_SPENDER_ID": "from-env"}
	c, err := parseConfig(nil, func(k string) string { return env[k] }, io.Discard)
	if err != nil || c.spenderID != "from-env" {
		t.Errorf("env: %q, %v", c.spenderID, err)
	}
	c, err = parseConfig([]string{"-spender-id", "gw-eu-1"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil || c.spenderID != "gw-eu-1" || spenderID(c.spenderID, 0) != "gw-eu-1-1" {
		t.Errorf("flag: %q, %v", c.spenderID, err)
	}
	long := strings.Repeat("s", ration.MaxSpenderIDLen-1) // fits alone, not with "-3"
	for _, bad := range []string{long, "bad\xff"} {
		if _, err := parseConfig([]string{"-spender-id", bad}, func(string) string { return "" }, io.Discard); err == nil ||
			!strings.Contains(err.Error(), "-spender-id") {
			t.Errorf("-spender-id %q: error %v, want one naming the flag", bad, err)
		}
	}
}

// TestSeparateProcessesShareOneAllocator: two demo
// processes (two fleets with their default ids) spend leases from one
// remote allocator. They must not move each other to new epochs (no
// refused call at the allocator, no warning in their logs), and each
// returns all its leases when it stops.
func TestSeparateProcessesShareOneAllocator(t *testing.T) {
	reg := prometheus.NewRegistry()
	am, err := allocator.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	allocURL, tokenFile, led := startLedger(t, 10*time.Second, allocator.WithMetrics(am))
	keys := writeKeys(t, []gateway.Key{{Key: "sk-p", ID: "p", Tenant: "t", RPM: 60000, TPM: 6_000_000}})

	var fleets []*fleet
	var logs []*testkit.SyncBuffer
	for range 2 {
		cfg := testConfig(t, 3, keys)
		cfg.allocatorURL, cfg.tokenFile = allocURL, tokenFile
		f, buf := startFleetLogs(t, cfg, nil)
		fleets = append(fleets, f)
		logs = append(logs, buf)
	}
	if fleets[0].spenderID == fleets[1].spenderID {
		t.Fatalf("both fleets use spender ids %s-*", fleets[0].spenderID)
	}

	// The key's limit is far above this load: any 429 would be false.
	var wg sync.WaitGroup
	var limited atomic.Int64
	for _, f := range fleets {
		for _, inst := range f.instances {
			wg.Go(func() {
				for range 20 {
					switch status, body := rawChat(t, inst.url, "sk-p", "share"); status {
					case http.StatusOK:
					case http.StatusTooManyRequests:
						limited.Add(1)
					default:
						t.Errorf("%s: %d %s", inst.url, status, body)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	if n := limited.Load(); n > 0 {
		t.Errorf("%d of 120 requests refused 429 with the budget there", n)
	}
	if got := led.Stats(); got.Spenders != 6 {
		t.Errorf("allocator stats %+v, want leases held by 6 spenders", got)
	}
	for _, f := range fleets {
		if err := f.stopInstances(t.Context()); err != nil {
			t.Errorf("fleet %s: %v", f.spenderID, err)
		}
	}
	if got := led.Stats(); got.Holdings != 0 {
		t.Errorf("after both fleets stopped: %+v, want no holdings", got)
	}
	calls, refused := allocatorCalls(t, reg)
	if calls == 0 || refused != 0 {
		t.Errorf("allocator answered %.0f calls, %.0f of them refused as stale (failed_precondition); want some, none refused", calls, refused)
	}
	for i, buf := range logs {
		if s := buf.String(); strings.Contains(s, "refused our epoch") || strings.Contains(s, "level=ERROR") {
			t.Errorf("fleet %d logged epoch trouble or an error", i+1)
		}
	}
}

// allocatorCalls sums ration_allocator_calls_total in reg: all calls, and
// those refused with failed_precondition (a stale epoch or sequence).
func allocatorCalls(t *testing.T, reg *prometheus.Registry) (calls, refused float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ration_allocator_calls_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			calls += m.GetCounter().GetValue()
			for _, l := range m.GetLabel() {
				if l.GetName() == "code" && l.GetValue() == "failed_precondition" {
					refused += m.GetCounter().GetValue()
				}
			}
		}
	}
	return calls, refused
}

// TestWrongTokenStopsTheStart: a token the allocator
// refuses is an error at start that names the flag, not a gateway that
// answers every request 429 from its fallback bucket.
func TestWrongTokenStopsTheStart(t *testing.T) {
	allocURL, _, _ := startLedger(t, 10*time.Second)
	wrong := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(wrong, []byte("not-the-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, 1, "")
	cfg.allocatorURL, cfg.tokenFile = allocURL, wrong
	f, err := start(t.Context(), cfg, deps{logOut: io.Discard})
	if err == nil {
		f.stop()
		t.Fatal("the demo started with a token the allocator refuses")
	}
	if !strings.Contains(err.Error(), "refused the token in -token-file "+wrong) {
		t.Fatalf("start: %v, want an error naming the token file", err)
	}
}

// TestDuplicateSpenderIDIsReported: two gateway processes started with the
// same -spender-id on one allocator. The older one finds out on its next
// allocator call: its /readyz turns 503 naming the duplicate, it stops
// calling the allocator, and its stop says its leases were not returned.
// The newer one serves on, ready; the allocator refuses one call in all
// (no epoch ping-pong).
func TestDuplicateSpenderIDIsReported(t *testing.T) {
	reg := prometheus.NewRegistry()
	am, err := allocator.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	allocURL, tokenFile, _ := startLedger(t, 10*time.Second, allocator.WithMetrics(am))
	keys := writeKeys(t, []gateway.Key{
		{Key: "sk-p", ID: "p", Tenant: "t", RPM: 60000, TPM: 6_000_000},
		{Key: "sk-q", ID: "q", Tenant: "t", RPM: 60000, TPM: 6_000_000},
	})
	twin := func() config {
		cfg := testConfig(t, 1, keys)
		cfg.allocatorURL, cfg.tokenFile, cfg.spenderID = allocURL, tokenFile, "twin"
		return cfg
	}
	logs := &testkit.SyncBuffer{}
	older, err := start(t.Context(), twin(), deps{logOut: logs})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			older.stop()
		}
	})
	if status, body := rawChat(t, older.instances[0].url, "sk-p", "first"); status != http.StatusOK {
		t.Fatalf("older: %d %s", status, body)
	}
	newer := startFleet(t, twin(), nil)
	if status, body := rawChat(t, newer.instances[0].url, "sk-p", "second"); status != http.StatusOK {
		t.Fatalf("newer: %d %s", status, body)
	}
	rawChat(t, older.instances[0].url, "sk-q", "a new key: an allocator call") // fallback decides: 200 or 429

	if status, body := get(t, older.instances[0].url+"/readyz"); status != http.StatusServiceUnavailable || !strings.Contains(body, "another live process") {
		t.Errorf("older /readyz: %d %q; want 503 naming the duplicate", status, body)
	}
	if status, body := get(t, newer.instances[0].url+"/readyz"); status != http.StatusOK {
		t.Errorf("newer /readyz: %d %q", status, body)
	}
	if !strings.Contains(logs.String(), "another live process uses our spender id") {
		t.Errorf("older logged no duplicate:\n%s", logs)
	}
	// No ping-pong: once the older knows, neither is refused again, however
	// many new keys each asks for. (The refusal itself may be counted more
	// than once: an attempt cut by a slow answer is sent again.)
	_, refused := allocatorCalls(t, reg)
	if refused < 1 {
		t.Fatalf("the allocator refused no call as stale")
	}
	for i := range 5 {
		rawChat(t, older.instances[0].url, "sk-q", "older "+strconv.Itoa(i))
		if status, body := rawChat(t, newer.instances[0].url, "sk-q", "newer "+strconv.Itoa(i)); status != http.StatusOK {
			t.Fatalf("newer: %d %s", status, body)
		}
	}
	stopped = true
	if err := older.stop(); err == nil || !strings.Contains(err.Error(), "another live process") {
		t.Errorf("older stop: %v; want an error naming the duplicate", err)
	}
	if _, after := allocatorCalls(t, reg); after != refused {
		t.Errorf("allocator refused %.0f calls as stale after the duplicate was found (%.0f before); want none; the older's logs:\n%s", after-refused, refused, logs)
	}
}

// get fetches url and returns its status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
