package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/echo"
	"github.com/rationhq/ration/gateway"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/internal/testkit"
	"github.com/rationhq/ration/spender"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// keysJSON is keys as a keys file, one entry per line.
func keysJSON(t testing.TB, keys ...gateway.Key) []byte {
	t.Helper()
	var b strings.Builder
	b.WriteString("[\n")
	for i, k := range keys {
		e, err := json.Marshal(k)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("  ")
		b.Write(e)
		if i < len(keys)-1 {
			b.WriteString(",")
		}
		b.WriteString("\n")
	}
	b.WriteString("]\n")
	return []byte(b.String())
}

// writeFile replaces path's content the way editors that rename do: a
// new file written beside it, then renamed over it.
func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// reloadRig is a gateway whose keys come from a keys file through a
// KeysReloader, in front of the echo engine, on a frozen clock.
type reloadRig struct {
	url  string
	path string
	rl   *gateway.KeysReloader
	reg  *prometheus.Registry
	logs *testkit.SyncBuffer
	clk  *fakeclock.Clock
}

// newReloadRig writes keys to a file and serves them. limiter nil is a
// standalone Limiter on the rig's clock; upstream nil is the echo engine.
func newReloadRig(t *testing.T, clk *fakeclock.Clock, limiter spenderhttp.Reserver, upstream http.Handler, keys ...gateway.Key) *reloadRig {
	t.Helper()
	if clk == nil {
		clk = fakeclock.New()
	}
	r := &reloadRig{path: filepath.Join(t.TempDir(), "keys.json"), reg: prometheus.NewRegistry(), logs: &testkit.SyncBuffer{}, clk: clk}
	writeFile(t, r.path, keysJSON(t, keys...))
	var err error
	r.rl, err = gateway.NewKeysReloader(r.path, slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug})), clk)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.rl.Register(r.reg); err != nil {
		t.Fatal(err)
	}
	if upstream == nil {
		upstream = echo.New(echo.WithClock(clk))
	}
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	u, err := gateway.ParseUpstream(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	if limiter == nil {
		limiter = testkit.Limiter(t, clk)
	}
	g, err := gateway.New(r.rl.Keys(), limiter, u, gateway.WithRegistry(r.reg),
		gateway.WithCounter(spenderhttp.TokenizeCounter{BaseURL: up.URL}), gateway.WithLimitOptions(spenderhttp.WithClock(clk)))
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(g)
	t.Cleanup(gw.Close)
	r.url = gw.URL + "/v1/chat/completions"
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("reloader logs:\n%s", r.logs.String())
		}
	})
	return r
}

// status sends a one-token chat with key and returns the answer.
func (r *reloadRig) status(t *testing.T, key string) *http.Response {
	t.Helper()
	resp, _ := post(t, r.url, key, chat("hi", `,"max_tokens":1`))
	return resp
}

// reloads returns ration_gateway_keys_reloads_total{result}.
func (r *reloadRig) reloads(result string) float64 {
	m, _ := r.reg.Gather()
	for _, f := range m {
		if f.GetName() != "ration_gateway_keys_reloads_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			if s.GetLabel()[0].GetValue() == result {
				return s.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// gauge returns the value of the gauge ration_gateway_keys_<name>.
func (r *reloadRig) gauge(name string) float64 {
	m, _ := r.reg.Gather()
	for _, f := range m {
		if f.GetName() == "ration_gateway_keys_"+name {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// TestReloadSwapsKeys: a reload removes, changes and adds keys for the
// very next request, counts itself, and logs the counts.
func TestReloadSwapsKeys(t *testing.T) {
	r := newReloadRig(t, nil, nil, nil,
		gateway.Key{Key: "sk-a", ID: "a", Tenant: "t", RPM: 10},
		gateway.Key{Key: "sk-b", ID: "b", Tenant: "t", RPM: 10},
		gateway.Key{Key: "sk-c", ID: "c", Tenant: "t", RPM: 10})
	loadedAt := r.gauge("last_reload_success_timestamp_seconds")
	if r.gauge("loaded") != 3 || r.gauge("last_reload_successful") != 1 || loadedAt != float64(fakeclock.Epoch().Unix()) ||
		r.reloads("ok") != 0 || r.reloads("error") != 0 {
		t.Fatalf("at start: loaded %v, successful %v, at %v, reloads %v/%v", r.gauge("loaded"), r.gauge("last_reload_successful"),
			loadedAt, r.reloads("ok"), r.reloads("error"))
	}
	for _, k := range []string{"sk-a", "sk-b", "sk-c"} {
		if resp := r.status(t, k); resp.StatusCode != 200 {
			t.Fatalf("%s before the reload: %d", k, resp.StatusCode)
		}
	}
	if resp := r.status(t, "sk-d"); resp.StatusCode != 401 {
		t.Fatalf("sk-d before the reload: %d", resp.StatusCode)
	}

	r.clk.Advance(time.Minute)
	writeFile(t, r.path, keysJSON(t,
		gateway.Key{Key: "sk-b", ID: "b", Tenant: "t", RPM: 20}, // changed
		gateway.Key{Key: "sk-c", ID: "c", Tenant: "t", RPM: 10}, // as it was
		gateway.Key{Key: "sk-d", ID: "d", Tenant: "t", RPM: 5},  // added; sk-a removed
	))
	d, err := r.rl.Reload()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(d.Added, ",") != "d" || strings.Join(d.Removed, ",") != "a" || strings.Join(d.Changed, ",") != "b" || d.Keys != 3 {
		t.Errorf("diff %+v, want added d, removed a, changed b", d)
	}
	resp := r.status(t, "sk-a")
	if resp.StatusCode != 401 {
		t.Errorf("removed key: %d, want 401 on the next request", resp.StatusCode)
	}
	if resp := r.status(t, "sk-b"); resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Limit-Requests") != "20" {
		t.Errorf("changed key: %d, limit %q, want 200 under the new limit 20", resp.StatusCode, resp.Header.Get("X-Ratelimit-Limit-Requests"))
	}
	if resp := r.status(t, "sk-d"); resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Limit-Requests") != "5" {
		t.Errorf("added key: %d, limit %q", resp.StatusCode, resp.Header.Get("X-Ratelimit-Limit-Requests"))
	}
	if r.reloads("ok") != 1 || r.reloads("error") != 0 || r.gauge("loaded") != 3 ||
		r.gauge("last_reload_success_timestamp_seconds") != loadedAt+60 {
		t.Errorf("after the reload: reloads %v/%v, loaded %v, at %v", r.reloads("ok"), r.reloads("error"), r.gauge("loaded"),
			r.gauge("last_reload_success_timestamp_seconds"))
	}
	logs := r.logs.String()
	for _, want := range []string{`msg="gateway: keys reloaded"`, "keys=3 added=1 removed=1 changed=1", "added_ids=[d]", "removed_ids=[a]", "changed_ids=[b]"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the reload's log line lacks %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "sk-") {
		t.Errorf("the logs show a secret:\n%s", logs)
	}
}

// TestReloadRefusesBadFile: a file with a syntax error or an invalid limit
// is refused whole, with its line and field; the keys in force keep
// serving, the refusal is counted and logged at ERROR; a good file after
// it is loaded.
func TestReloadRefusesBadFile(t *testing.T) {
	good := []gateway.Key{{Key: "sk-a", ID: "a", Tenant: "t", RPM: 10}, {Key: "sk-b", ID: "b", Tenant: "t", RPM: 10}}
	r := newReloadRig(t, nil, nil, nil, good...)
	bad := []struct {
		name, file  string
		line, field string
		msg         string
	}{
		{"syntax error", "[\n  {\"key\": \"sk-c\", \"id\": \"c\", \"rpm\": 1, \"tpm\": 0},\n  {\"key\": \"sk-a\" \"id\": \"a\"}\n]\n",
			"line=3 column=18", "", `line 3, column 18: entry 1: invalid JSON: invalid character '"' after object key:value pair`},
		{"invalid limit", "[\n  {\"key\": \"sk-c\", \"id\": \"c\", \"rpm\": 1, \"tpm\": 0},\n  {\"key\": \"sk-a\", \"id\": \"a\", \"rpm\": -60, \"tpm\": 0}\n]\n",
			"line=3 column=30", "field=rpm", `line 3, column 30: entry 1 (id "a"): "rpm": -60 outside [0, 1000000000000]`},
	}
	for i, tt := range bad {
		writeFile(t, r.path, []byte(tt.file))
		_, err := r.rl.Reload()
		var ke *gateway.KeysError
		if !errors.As(err, &ke) || !strings.Contains(err.Error(), tt.msg) || !strings.Contains(err.Error(), r.path) {
			t.Errorf("%s: %v, want a *KeysError naming the file and %q", tt.name, err, tt.msg)
		}
		for _, k := range []string{"sk-a", "sk-b"} {
			if resp := r.status(t, k); resp.StatusCode != 200 {
				t.Errorf("%s: %s got %d; the keys in force must stay", tt.name, k, resp.StatusCode)
			}
		}
		if resp := r.status(t, "sk-c"); resp.StatusCode != 401 {
			t.Errorf("%s: sk-c, only in the refused file, got %d", tt.name, resp.StatusCode)
		}
		if r.reloads("error") != float64(i+1) || r.reloads("ok") != 0 || r.gauge("last_reload_successful") != 0 || r.gauge("loaded") != 2 {
			t.Errorf("%s: reloads ok %v error %v, successful %v, loaded %v", tt.name, r.reloads("ok"), r.reloads("error"),
				r.gauge("last_reload_successful"), r.gauge("loaded"))
		}
		var line string
		for l := range strings.Lines(r.logs.String()) {
			if strings.Contains(l, "level=ERROR") && strings.Contains(l, tt.line) {
				line = l
			}
		}
		if line == "" || !strings.Contains(line, "keys file refused") || !strings.Contains(line, tt.field) || !strings.Contains(line, "keys_in_force=2") {
			t.Errorf("%s: no ERROR line with %q and %q:\n%s", tt.name, tt.line, tt.field, r.logs.String())
		}
	}
	writeFile(t, r.path, keysJSON(t, append(good, gateway.Key{Key: "sk-c", ID: "c", Tenant: "t", RPM: 1})...))
	if _, err := r.rl.Reload(); err != nil {
		t.Fatal(err)
	}
	if resp := r.status(t, "sk-c"); resp.StatusCode != 200 || r.gauge("last_reload_successful") != 1 || r.gauge("loaded") != 3 {
		t.Errorf("after the fix: sk-c %d, successful %v, loaded %v", resp.StatusCode, r.gauge("last_reload_successful"), r.gauge("loaded"))
	}
}

// startRun runs rl.Run on the rig's clock with interval and hup until the
// test ends, and waits until the first poll is scheduled.
func startRun(t *testing.T, r *reloadRig, interval time.Duration, hup <-chan os.Signal) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.rl.Run(ctx, interval, hup)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if n := r.clk.Timers(); n != 0 {
			t.Errorf("%d polls still scheduled after Run returned", n)
		}
	})
	if interval <= 0 {
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for r.clk.Timers() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("Run scheduled no poll")
		}
		time.Sleep(time.Millisecond) // waiting for Run's goroutine to start, not for time to pass
	}
}

// TestReloadPollsContent: with an interval, a change of the file's
// content is picked up at the next poll, however the file was replaced
// (renamed over, or rewritten in place at the same size and modification
// time); an unchanged file is not reloaded; content caught half written
// is not refused if the next poll finds it complete; content still bad
// at the next poll is refused once.
func TestReloadPollsContent(t *testing.T) {
	const every = time.Second
	a := gateway.Key{Key: "sk-a", ID: "a", Tenant: "t", RPM: 10}
	r := newReloadRig(t, nil, nil, nil, a)
	startRun(t, r, every, nil)
	poll := func() { r.clk.Advance(every) } // runs the due poll before it returns

	// Renamed over.
	writeFile(t, r.path, keysJSON(t, a, gateway.Key{Key: "sk-b1", ID: "b", Tenant: "t", RPM: 10}))
	if resp := r.status(t, "sk-b1"); resp.StatusCode != 401 {
		t.Fatalf("sk-b1 works before any poll: %d", resp.StatusCode)
	}
	poll()
	if resp := r.status(t, "sk-b1"); resp.StatusCode != 200 || r.reloads("ok") != 1 {
		t.Fatalf("after a poll: sk-b1 %d, reloads %v", resp.StatusCode, r.reloads("ok"))
	}

	// Unchanged: no reload.
	poll()
	poll()
	if r.reloads("ok") != 1 {
		t.Errorf("an unchanged file was reloaded: %v reloads", r.reloads("ok"))
	}

	// Rewritten in place with the same size and modification time: only
	// the content tells.
	st, err := os.Stat(r.path)
	if err != nil {
		t.Fatal(err)
	}
	same := keysJSON(t, a, gateway.Key{Key: "sk-b2", ID: "b", Tenant: "t", RPM: 10})
	if int64(len(same)) != st.Size() {
		t.Fatalf("test setup: %d bytes, want %d", len(same), st.Size())
	}
	if err := os.WriteFile(r.path, same, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(r.path, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	poll()
	if r.status(t, "sk-b2").StatusCode != 200 || r.status(t, "sk-b1").StatusCode != 401 {
		t.Errorf("a same-size, same-mtime rewrite was not picked up")
	}

	// Caught half written, complete at the next poll: loaded, no error.
	full := keysJSON(t, a, gateway.Key{Key: "sk-b3", ID: "b", Tenant: "t", RPM: 10})
	if err := os.WriteFile(r.path, full[:len(full)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	poll()
	if r.reloads("error") != 0 || r.status(t, "sk-b2").StatusCode != 200 {
		t.Errorf("half-written file: %v errors, or the keys in force stopped serving", r.reloads("error"))
	}
	if err := os.WriteFile(r.path, full, 0o600); err != nil {
		t.Fatal(err)
	}
	poll()
	if r.reloads("error") != 0 || r.status(t, "sk-b3").StatusCode != 200 {
		t.Errorf("completed file: %v errors, sk-b3 not in force", r.reloads("error"))
	}

	// Bad at two polls in a row: refused once, and not again while it
	// stays the same.
	writeFile(t, r.path, []byte(`[{"key":"sk-a","id":"a","rpm":1}]`))
	poll()
	if r.reloads("error") != 0 {
		t.Errorf("refused at the first poll: %v", r.reloads("error"))
	}
	poll()
	poll()
	poll()
	if r.reloads("error") != 1 || r.gauge("last_reload_successful") != 0 || r.status(t, "sk-b3").StatusCode != 200 {
		t.Errorf("bad file: %v errors, successful %v; want 1 refusal and the keys in force serving", r.reloads("error"),
			r.gauge("last_reload_successful"))
	}
	if n := strings.Count(r.logs.String(), "level=ERROR"); n != 1 {
		t.Errorf("%d ERROR lines for one bad file, want 1", n)
	}

	// A deleted file is like a bad one: the keys in force stay.
	if err := os.Remove(r.path); err != nil {
		t.Fatal(err)
	}
	poll()
	poll()
	if r.reloads("error") != 2 || r.status(t, "sk-b3").StatusCode != 200 {
		t.Errorf("deleted file: %v errors", r.reloads("error"))
	}
	writeFile(t, r.path, full)
	poll()
	if r.gauge("last_reload_successful") != 1 || r.status(t, "sk-b3").StatusCode != 200 {
		t.Errorf("restored file not loaded")
	}
}

// TestReloadOnSignal: every value on Run's hup channel reloads at once,
// even when the content is unchanged; with interval 0 nothing polls.
func TestReloadOnSignal(t *testing.T) {
	r := newReloadRig(t, nil, nil, nil, gateway.Key{Key: "sk-a", ID: "a", Tenant: "t", RPM: 10})
	hup := make(chan os.Signal)
	startRun(t, r, 0, hup)
	writeFile(t, r.path, keysJSON(t, gateway.Key{Key: "sk-b", ID: "b", Tenant: "t", RPM: 10}))
	r.clk.Advance(time.Hour)
	if r.clk.Timers() != 0 || r.status(t, "sk-b").StatusCode != 401 {
		t.Fatal("interval 0 polled")
	}
	hup <- os.Interrupt // any value; the demo sends SIGHUP
	hup <- os.Interrupt // unbuffered: the first reload is done once this is received
	if r.status(t, "sk-b").StatusCode != 200 || r.status(t, "sk-a").StatusCode != 401 || r.reloads("ok") < 1 {
		t.Errorf("after a signal: reloads %v", r.reloads("ok"))
	}
}

// TestReloadKeepsRequestsInFlight: a request authenticated before a swap
// finishes under the keys it started with, settled under its limits,
// although its key is gone by then; the next request with that key is
// 401.
func TestReloadKeepsRequestsInFlight(t *testing.T) {
	clk := fakeclock.New()
	eng := echo.New(echo.WithClock(clk))
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	upstream := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/v1/chat/completions" {
			once.Do(func() { close(entered); <-release })
		}
		eng.ServeHTTP(w, req)
	})
	r := newReloadRig(t, clk, nil, upstream, gateway.Key{Key: "sk-a", ID: "a", Tenant: "t", RPM: 2})
	done := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, r.url, strings.NewReader(chat("in flight", `,"max_tokens":2`)))
		req.Header.Set("Authorization", "Bearer sk-a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			done <- nil
			return
		}
		resp.Body.Close()
		done <- resp
	}()
	<-entered // admitted and at the engine
	writeFile(t, r.path, keysJSON(t, gateway.Key{Key: "sk-b", ID: "b", Tenant: "t", RPM: 2}))
	if _, err := r.rl.Reload(); err != nil {
		t.Fatal(err)
	}
	if resp := r.status(t, "sk-a"); resp.StatusCode != 401 {
		t.Errorf("sk-a after the swap: %d, want 401", resp.StatusCode)
	}
	close(release)
	resp := <-done
	if resp == nil || resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Limit-Requests") != "2" {
		t.Fatalf("the request in flight: %+v, want 200 under the limits it started with", resp)
	}
}

// TestChangedLimitsTakeEffectOnNextRequest (standalone Limiter, frozen
// clock): a key's new limits apply to its next request; a lower limit
// caps what is left at the new capacity, a higher one mints nothing.
func TestChangedLimitsTakeEffectOnNextRequest(t *testing.T) {
	k := gateway.Key{Key: "sk-k", ID: "k", Tenant: "t", RPM: 6}
	r := newReloadRig(t, nil, nil, nil, k)
	for i := range 2 {
		if resp := r.status(t, "sk-k"); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	} // 4 of 6 left
	set := func(rpm int64) {
		t.Helper()
		k.RPM = rpm
		writeFile(t, r.path, keysJSON(t, k))
		if _, err := r.rl.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	set(3) // halved: the 4 left are capped at the new capacity, 3
	var got []string
	for range 4 {
		resp := r.status(t, "sk-k")
		got = append(got, resp.Status[:3]+"/"+resp.Header.Get("X-Ratelimit-Limit-Requests")+"/"+resp.Header.Get("X-Ratelimit-Remaining-Requests"))
	}
	if want := "200/3/2 200/3/1 200/3/0 429/3/0"; strings.Join(got, " ") != want {
		t.Errorf("after halving: %v, want %s (status/limit/remaining)", got, want)
	}
	set(6) // doubled: nothing minted; refill at the new rate, one per 10 s
	resp := r.status(t, "sk-k")
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "10" || resp.Header.Get("X-Ratelimit-Limit-Requests") != "6" {
		t.Errorf("after doubling: %d, Retry-After %q, limit %q; want 429 after 10 s (no budget minted)",
			resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("X-Ratelimit-Limit-Requests"))
	}
	r.clk.Advance(10 * time.Second)
	if resp := r.status(t, "sk-k"); resp.StatusCode != 200 {
		t.Errorf("10 s after doubling: %d", resp.StatusCode)
	}
}

// TestLeasedKeyKeepsLeaseAcrossLimitChange checks the claim the reload
// relies on, on a leased Limiter (in-process allocator, frozen clock): a
// key whose limits change keeps its lease (the next request is admitted
// from it, nothing is returned), and the allocator follows the new limits
// on the next call: after halving RPM 600 to 300, what the key can still
// spend is the lease it held plus at most the new capacity, not the 598
// the old one had left; after doubling back, nothing is minted.
func TestLeasedKeyKeepsLeaseAcrossLimitChange(t *testing.T) {
	clk := fakeclock.New()
	led, err := allocator.New(allocator.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { led.Close() })
	reg := prometheus.NewRegistry()
	m, err := spender.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	tune := spender.DefaultLeaseTuning()
	tune.SlowPathDeadline = time.Hour // the clock is frozen: always wait for the allocator's answer
	lim := testkit.Limiter(t, clk, spender.WithLeases(allocator.NewService(led)), spender.WithLeaseTuning(tune), spender.WithMetrics(m))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		lim.Close(ctx)
	})
	k := gateway.Key{Key: "sk-k", ID: "k", Tenant: "t", RPM: 600}
	r := newReloadRig(t, clk, lim, nil, k)
	counter := func(name, label string) float64 {
		mfs, _ := reg.Gather()
		for _, f := range mfs {
			if f.GetName() != name {
				continue
			}
			var n float64
			for _, s := range f.GetMetric() {
				for _, l := range s.GetLabel() {
					if strings.Contains(label, l.GetName()+"="+l.GetValue()) {
						n += s.GetCounter().GetValue()
					}
				}
			}
			return n
		}
		return 0
	}
	set := func(rpm int64) {
		t.Helper()
		k.RPM = rpm
		writeFile(t, r.path, keysJSON(t, k))
		if _, err := r.rl.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		if resp := r.status(t, "sk-k"); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	local := counter("ration_spender_admitted_total", "path=local")
	set(300)
	if resp := r.status(t, "sk-k"); resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Limit-Requests") != "300" {
		t.Fatalf("first request after halving: %d, limit %q", resp.StatusCode, resp.Header.Get("X-Ratelimit-Limit-Requests"))
	}
	if got := counter("ration_spender_admitted_total", "path=local"); got != local+1 {
		t.Errorf("the first request after the change was not admitted from the lease: local admissions %v -> %v", local, got)
	}
	if n := counter("ration_spender_lease_calls_total", "method=Release"); n != 0 {
		t.Errorf("%v Release calls: a limit change must not give the lease back", n)
	}
	// Spend until refused. The first lease of a key with no spend history
	// asks for at most an eighth of its capacity (75 of 600), so at most
	// 75 - 2 of it was left at the change.
	after := 1
	for ; after < 1000; after++ {
		if r.status(t, "sk-k").StatusCode != 200 {
			break
		}
	}
	if after < 300 || after > 300+73 {
		t.Errorf("admitted %d after halving to 300 with the clock frozen; want at least 300 and at most 300 + the lease held (<= 73); "+
			"598 would mean the allocator kept the old limits", after)
	}
	t.Logf("admitted %d after halving RPM 600 to 300", after)
	set(600)
	if resp := r.status(t, "sk-k"); resp.StatusCode != 429 {
		t.Errorf("after doubling back with the clock frozen: %d, want 429 (nothing minted)", resp.StatusCode)
	}
}
