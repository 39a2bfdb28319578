package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rationhq/ration/gateway"
)

// rewriteKeys replaces the keys file at path with keys, written beside it
// and renamed over it, as editors and config management do.
func rewriteKeys(t *testing.T, path string, keys []gateway.Key) {
	t.Helper()
	b, err := json.MarshalIndent(keys, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	rewriteFile(t, path, b)
}

func rewriteFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path+".new", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond every 10 ms until it holds or within passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond) // waiting on the demo's poll, on the real clock
	}
}

// metricValue returns the value of the sample of name whose labels
// include every "k=v" in labels (summed over matches), from reg.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range mfs {
		if f.GetName() != name {
			continue
		}
	samples:
		for _, m := range f.GetMetric() {
			for _, want := range labels {
				found := false
				for _, l := range m.GetLabel() {
					found = found || l.GetName()+"="+l.GetValue() == want
				}
				if !found {
					continue samples
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// TestDemoReloadsChangedKeysFile: with -keys-reload-interval, a change to
// the keys file reaches every instance without a signal: a removed key is
// 401, a changed one has its new limits, an added one works; each
// instance's /metrics shows the reload. A file that then fails
// validation is refused: the keys in force keep serving on every
// instance, the refusal is counted and logged at ERROR with the line and
// field.
func TestDemoReloadsChangedKeysFile(t *testing.T) {
	path := writeKeys(t, []gateway.Key{
		{Key: "sk-a", ID: "a", Tenant: "t", RPM: 600},
		{Key: "sk-b", ID: "b", Tenant: "t", RPM: 600},
	})
	cfg := testConfig(t, 2, path)
	cfg.keysReload = 20 * time.Millisecond
	f, logs := startFleetLogs(t, cfg, nil)
	var banner bytes.Buffer
	f.banner(&banner)
	if !strings.Contains(banner.String(), "The file is live: edits are loaded within 20ms") {
		t.Errorf("the banner does not say the file is live:\n%s", banner.String())
	}
	for _, inst := range f.instances {
		if st, body := rawChat(t, inst.url, "sk-a", "before"); st != http.StatusOK {
			t.Fatalf("%s: sk-a before the change: %d %s", inst.url, st, body)
		}
	}

	rewriteKeys(t, path, []gateway.Key{
		{Key: "sk-b", ID: "b", Tenant: "t", RPM: 300},
		{Key: "sk-c", ID: "c", Tenant: "t", RPM: 60},
	})
	eventually(t, 5*time.Second, "sk-c accepted", func() bool {
		st, _ := rawChat(t, f.instances[0].url, "sk-c", "poll")
		return st == http.StatusOK
	})
	for _, inst := range f.instances {
		if st, _ := rawChat(t, inst.url, "sk-a", "removed"); st != http.StatusUnauthorized {
			t.Errorf("%s: removed key: %d, want 401", inst.url, st)
		}
		if st, _ := rawChat(t, inst.url, "sk-c", "added"); st != http.StatusOK {
			t.Errorf("%s: added key: %d", inst.url, st)
		}
		resp, _ := postChat(t, inst.url, "sk-b", "x")
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Ratelimit-Limit-Requests") != "300" {
			t.Errorf("%s: changed key: %d, limit %q, want the new 300", inst.url, resp.StatusCode, resp.Header.Get("X-Ratelimit-Limit-Requests"))
		}
		_, body := get(t, inst.url+"/metrics")
		for _, want := range []string{
			`ration_gateway_keys_reloads_total{result="ok"} 1`, `ration_gateway_keys_reloads_total{result="error"} 0`,
			"ration_gateway_keys_loaded 2", "ration_gateway_keys_last_reload_successful 1",
			"ration_gateway_keys_last_reload_success_timestamp_seconds ",
		} {
			if !strings.Contains(body, want) {
				t.Errorf("%s/metrics lacks %q", inst.url, want)
			}
		}
	}
	if !strings.Contains(logs.String(), "trigger=\"file changed\" keys=2 added=1 removed=1 changed=1") {
		t.Errorf("no reload log line with the counts:\n%s", logs.String())
	}

	rewriteFile(t, path, []byte("[\n  {\"key\": \"sk-b\", \"id\": \"b\", \"tenant\": \"t\", \"rpm\": 300, \"tpm\": 0},\n  {\"key\": \"sk-d\", \"id\": \"d\", \"tenant\": \"t\", \"rpm\": 1e3, \"tpm\": 0}\n]\n"))
	eventually(t, 5*time.Second, "the bad file refused", func() bool {
		return metricValue(t, f.instances[0].reg, "ration_gateway_keys_reloads_total", "result=error") == 1
	})
	for _, inst := range f.instances {
		for _, k := range []string{"sk-b", "sk-c"} {
			if st, _ := rawChat(t, inst.url, k, "still"); st != http.StatusOK {
				t.Errorf("%s: %s after a refused file: %d; the keys in force must stay", inst.url, k, st)
			}
		}
		if st, _ := rawChat(t, inst.url, "sk-d", "refused"); st != http.StatusUnauthorized {
			t.Errorf("%s: sk-d, only in the refused file: %d", inst.url, st)
		}
		if metricValue(t, inst.reg, "ration_gateway_keys_last_reload_successful") != 0 || metricValue(t, inst.reg, "ration_gateway_keys_loaded") != 2 {
			t.Errorf("%s: last_reload_successful or loaded wrong after a refusal", inst.url)
		}
	}
	var line string
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "level=ERROR") {
			line = l
		}
	}
	for _, want := range []string{"keys file refused", "line=3", "entry=1", "id=d", "field=rpm", `\"rpm\": got a JSON number 1e3, want a whole number`} {
		if !strings.Contains(line, want) {
			t.Errorf("the ERROR line lacks %q: %s", want, line)
		}
	}
}

// TestDemoWithoutKeysFileIgnoresSIGHUP: with the built-in keys there is
// nothing to reload; a SIGHUP is logged and changes nothing.
func TestDemoWithoutKeysFileIgnoresSIGHUP(t *testing.T) {
	hup := make(chan os.Signal, 1)
	cfg := testConfig(t, 1, "")
	f, buf := startFleetLogsDeps(t, cfg, deps{hup: hup})
	hup <- os.Interrupt
	eventually(t, 5*time.Second, "the SIGHUP logged", func() bool {
		return strings.Contains(buf.String(), "no keys file to reload")
	})
	if st, _ := rawChat(t, f.instances[0].url, "sk-ration-demo-large", "still"); st != http.StatusOK {
		t.Errorf("demo key after SIGHUP: %d", st)
	}
}
