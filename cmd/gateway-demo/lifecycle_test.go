package main

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/rationhq/ration/gateway"
)

// TestStopReturnsLeases: stopping the instances hands every lease back to
// the embedded allocator, which then holds none for any spender.
func TestStopReturnsLeases(t *testing.T) {
	keys := writeKeys(t, []gateway.Key{{Key: "sk-a", ID: "a", Tenant: "t", RPM: 600, TPM: 60000}})
	f := startFleet(t, testConfig(t, 3, keys), nil)
	for _, inst := range f.instances {
		if status, body := rawChat(t, inst.url, "sk-a", "hold"); status != http.StatusOK {
			t.Fatalf("%s: %d %s", inst.url, status, body)
		}
	}
	if got := f.source.ledger.Stats(); got.Holdings == 0 || got.Spenders != 3 {
		t.Fatalf("before stopping: %+v, want leases held by 3 spenders", got)
	}
	if err := f.stopInstances(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := f.source.ledger.Stats(); got.Holdings != 0 {
		t.Errorf("after stopping the instances: %+v, want no holdings", got)
	}
}

// TestRestartKeepsSpentBudget: the ledger is durable, so a demo restarted
// on the same data directory does not hand a spent key a fresh minute.
func TestRestartKeepsSpentBudget(t *testing.T) {
	keys := writeKeys(t, []gateway.Key{{Key: "sk-r", ID: "r", Tenant: "t", RPM: 3}})
	cfg := testConfig(t, 2, keys)
	f, err := start(t.Context(), cfg, deps{})
	if err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for range 10 {
		if status, _ := rawChat(t, f.instances[0].url, "sk-r", "spend"); status == http.StatusOK {
			admitted++
		}
	}
	if err := f.stop(); err != nil {
		t.Fatal(err)
	}
	if admitted != 3 {
		t.Fatalf("admitted %d of 10 at 3 RPM", admitted)
	}
	f2 := startFleet(t, cfg, nil) // same data directory
	for _, inst := range f2.instances {
		if status, body := rawChat(t, inst.url, "sk-r", "again"); status != http.StatusTooManyRequests {
			t.Errorf("%s after the restart: %d %s, want 429 (the minute's 3 requests are spent)", inst.url, status, body)
		}
	}
}

// TestDataDirInUse: a second demo on the same data directory fails with
// a message that says what to do. It waits out bbolt's 5 s lock timeout,
// idle, so it runs in parallel with the rest.
func TestDataDirInUse(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, 1, "")
	startFleet(t, cfg, nil)
	_, err := start(t.Context(), cfg, deps{})
	if err == nil || !strings.Contains(err.Error(), "-data") {
		t.Fatalf("second demo on one data dir: %v, want an error naming -data", err)
	}
	t.Log(err)
}

// TestBanner: the banner names every instance, the engine, the allocator,
// the demo keys and curl lines that use them.
func TestBanner(t *testing.T) {
	f := startFleet(t, testConfig(t, 3, ""), nil)
	var b bytes.Buffer
	f.banner(&b)
	out := b.String()
	for _, want := range []string{
		f.instances[0].url + "/v1", f.instances[2].url + "/metrics", f.engineURL, "embedded, ledger in " + f.cfg.dataDir,
		"sk-ration-demo-small", "3 RPM", "curl -sS -i " + f.instances[0].url + "/v1/chat/completions",
		"Retry-After", `"stream":true`, "Ctrl-C",
		`-H "Authorization: Bearer sk-ration-demo-small"`, // double quotes, so that $RATION_KEY would expand
	} {
		if !strings.Contains(out, want) {
			t.Errorf("banner lacks %q:\n%s", want, out)
		}
	}
}

// TestAccessLogNamesInstanceAndKey: with the access log on, each request
// is one line naming the instance, the key's id and the verdict; the
// secret appears nowhere in the log.
func TestAccessLogNamesInstanceAndKey(t *testing.T) {
	keys := writeKeys(t, []gateway.Key{{Key: "sk-secret-a", ID: "a", Tenant: "t", RPM: 1}})
	cfg := testConfig(t, 2, keys)
	cfg.accessLog = true
	f, logs := startFleetLogs(t, cfg, nil)
	for _, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		if status, body := rawChat(t, f.instances[1].url, "sk-secret-a", "hello"); status != want {
			t.Fatalf("%d %s, want %d", status, body, want)
		}
	}
	for _, want := range []string{
		`msg="gateway: request" instance=2 method=POST path=/v1/chat/completions key=a status=200 `,
		`msg="gateway: request" instance=2 method=POST path=/v1/chat/completions key=a status=429 `,
		` limit=refused budget=a dimension=requests`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("the log lacks %q:\n%s", want, logs.String())
		}
	}
	if strings.Contains(logs.String(), "sk-secret-a") {
		t.Fatalf("the log shows the secret:\n%s", logs.String())
	}
}
