package main

import (
	"context"
	"errors"
	"flag"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/internal/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const token = "gateway-token-for-tests"

// startAllocator serves an allocator with lease TTL ttl on a loopback
// port, requiring the gateway token, and returns its URL.
func startAllocator(t *testing.T, ttl time.Duration) string {
	t.Helper()
	led, err := allocator.Open(filepath.Join(t.TempDir(), "allocator.db"), allocator.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	allocator.Mount(mux, allocator.NewService(led), allocator.BearerAuth([]string{token}, nil))
	url := testkit.H2C(t, mux)
	t.Cleanup(func() { led.Close() }) // after the server (registered before it)
	return url
}

// startSidecar runs the sidecar (run, as main does) with args and returns
// its address; it is stopped, and must stop cleanly, when the test ends.
func startSidecar(t *testing.T, args ...string) string {
	t.Helper()
	cfg, err := parseConfig(append([]string{"-listen", "127.0.0.1:0"}, args...), func(string) string { return "" }, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	logs := &testkit.SyncBuffer{}
	go func() { done <- run(ctx, cfg, deps{logOut: logs, ready: func(a string) { addr <- a }}) }()
	var a string
	select {
	case a = <-addr:
	case err := <-done:
		t.Fatalf("sidecar did not start: %v\n%s", err, logs)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sidecar stopped with %v\n%s", err, logs)
		}
		if !strings.Contains(logs.String(), "every lease returned") {
			t.Errorf("sidecar did not return its leases:\n%s", logs)
		}
	})
	return a
}

func tokenFile(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func configDir(t *testing.T, yaml string) string {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "gw.yaml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func rlsClient(t *testing.T, target string) rlsv3.RateLimitServiceClient {
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func shouldRateLimit(ctx context.Context, c rlsv3.RateLimitServiceClient, kv ...string) (*rlsv3.RateLimitResponse, error) {
	d := &rlcommon.RateLimitDescriptor{HitsAddend: wrapperspb.UInt64(1)}
	for _, e := range kv {
		k, v, _ := strings.Cut(e, "=")
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "gw", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
}

// perMinute is C = 120, rho = 2 per second. (A per-second rule is
// enforced within the same bound; on leases it admits well below its rate
// under saturation, so the lower check would not hold for it.)
const perMinute = `
domain: gw
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 120}
`

// TestThreeSidecarsShareOneKey: three sidecars on one allocator, each
// hammered by Envoy's gRPC client on the same descriptor, admit together
// what one budget allows: counted from the clients' side, at most
// C + rho*(t + TTL) over the run (docs/bound.md), and at least C. Then a
// client refused with OVER_LIMIT that waits duration_until_reset (and,
// on leases, each new one it is told) is admitted within one lease TTL of
// the first wait.
func TestThreeSidecarsShareOneKey(t *testing.T) {
	const (
		capacity = 120 // requests_per_unit, per minute
		rho      = 2.0 // per second
		ttl      = time.Second
		run      = 3 * time.Second
	)
	alloc := startAllocator(t, ttl)
	dir, tf := configDir(t, perMinute), tokenFile(t)
	var clients []rlsv3.RateLimitServiceClient
	for range 3 {
		addr := startSidecar(t, "-allocator", alloc, "-token-file", tf, "-ratelimit-config", dir)
		clients = append(clients, rlsClient(t, addr))
	}
	var admitted, refused atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for _, c := range clients {
		for range 4 {
			wg.Go(func() {
				for time.Since(start) < run {
					res, err := shouldRateLimit(ctx, c, "api_key=shared")
					if err != nil {
						t.Error(err)
						return
					}
					if res.OverallCode == rlsv3.RateLimitResponse_OK {
						admitted.Add(1)
					} else {
						refused.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	bound := capacity + rho*(elapsed+ttl.Seconds())
	exact := capacity + rho*elapsed
	t.Logf("admitted %d, refused %d in %.2fs: one bucket would admit %.0f; bound %.0f", admitted.Load(), refused.Load(), elapsed, exact, bound)
	if float64(admitted.Load()) > bound {
		t.Fatalf("admitted %d > C + rho*(t+TTL) = %.0f", admitted.Load(), bound)
	}
	if admitted.Load() < capacity {
		t.Fatalf("admitted %d: less than the key's capacity %d", admitted.Load(), capacity)
	}

	// A key of its own on one sidecar: spend it, then honour the wait.
	c := clients[0]
	var res *rlsv3.RateLimitResponse
	for range capacity + 1 {
		var err error
		if res, err = shouldRateLimit(ctx, c, "api_key=alone"); err != nil {
			t.Fatal(err)
		}
	}
	if res.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("the %dth request: %v", capacity+1, res)
	}
	wait := res.Statuses[0].DurationUntilReset.AsDuration()
	first := wait
	if wait <= 0 || wait > 500*time.Millisecond {
		t.Fatalf("duration_until_reset %v: want a request's refill, (0, 500ms]", wait)
	}
	// On leases the wait is what the allocator last named: the client
	// follows each new wait until admitted, and the total is measured
	// against the first.
	begin := time.Now()
	tries := 0
	for {
		time.Sleep(wait)
		tries++
		res, err := shouldRateLimit(ctx, c, "api_key=alone")
		if err != nil {
			t.Fatal(err)
		}
		if res.OverallCode == rlsv3.RateLimitResponse_OK {
			break
		}
		wait = res.Statuses[0].DurationUntilReset.AsDuration()
		if tries == 20 {
			t.Fatalf("not admitted after %d waits (%v)", tries, time.Since(begin))
		}
	}
	total := time.Since(begin)
	t.Logf("admitted after %d waits, %v in all; the first wait was %v", tries, total, first)
	if total > first+ttl {
		t.Fatalf("admitted %v after the first wait of %v: later than one lease TTL (%v)", total, first, ttl)
	}
}

// TestUnixSocket: -listen unix:PATH serves on a socket with
// -unix-socket-mode, and /readyz answers there.
func TestUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "ration.sock")
	cfg, err := parseConfig([]string{"-listen", "unix:" + sock, "-embedded", "-data-dir", t.TempDir(), "-unix-socket-mode", "0600"},
		func(string) string { return "" }, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan string, 1), make(chan error, 1)
	go func() { done <- run(ctx, cfg, deps{ready: func(a string) { ready <- a }}) }()
	<-ready
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v %v", fi, err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := hc.Get("http://sidecar/readyz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("readyz: %v %v", resp, err)
	}
	resp.Body.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestFlags: the flag combinations that cannot work are refused at start.
func TestFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "either -allocator"},
		{[]string{"-embedded", "-allocator", "http://a:7450"}, "either -allocator"},
		{[]string{"-allocator", "http://a:7450"}, "needs -token-file"},
		{[]string{"-embedded", "-token-file", "t"}, "needs no token"},
		{[]string{"-embedded", "-hold", "0s"}, "-hold"},
		{[]string{"-embedded", "-max-open-reservations", "0"}, "at least 1"},
		{[]string{"-allocator", "ftp://a", "-token-file", "t"}, "-allocator"},
		{[]string{"-embedded", "-listen", "unix:"}, "needs a path"},
	} {
		_, err := parseConfig(c.args, func(string) string { return "" }, &strings.Builder{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want %q", c.args, err, c.want)
		}
	}
	cfg, err := parseConfig(nil, func(k string) string {
		return map[string]string{"RATION_SIDECAR_EMBEDDED": "true", "RATION_SIDECAR_HOLD": "1m"}[k]
	}, &strings.Builder{})
	if err != nil || !cfg.embedded || cfg.hold != time.Minute {
		t.Fatalf("environment: %+v %v", cfg, err)
	}
	var help strings.Builder
	if _, err := parseConfig([]string{"-help"}, func(string) string { return "" }, &help); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-help: %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"usage: sidecar", "-ratelimit-config", "(env RATION_SIDECAR_RATELIMIT_CONFIG)", "(env RATION_SIDECAR_TOKEN_FILE)"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("-help does not say %q:\n%s", want, help.String())
		}
	}
}

// TestConfigReload: SIGHUP reloads -ratelimit-config; a configuration
// that does not load is logged and the one in force stays.
func TestConfigReload(t *testing.T) {
	dir := configDir(t, perMinute) // api_key: 120 a minute
	cfg, err := parseConfig([]string{"-listen", "127.0.0.1:0", "-embedded", "-data-dir", t.TempDir(),
		"-ratelimit-config", dir, "-ratelimit-config-reload-interval", "0"}, func(string) string { return "" }, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	hup := make(chan os.Signal)
	addr, done := make(chan string, 1), make(chan error, 1)
	logs := &testkit.SyncBuffer{}
	go func() { done <- run(ctx, cfg, deps{logOut: logs, hup: hup, ready: func(a string) { addr <- a }}) }()
	c := rlsClient(t, <-addr)
	limitOf := func() uint32 {
		t.Helper()
		res, err := shouldRateLimit(ctx, c, "api_key=k")
		if err != nil {
			t.Fatal(err)
		}
		return res.Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	if got := limitOf(); got != 120 {
		t.Fatalf("limit %d, want 120", got)
	}
	write := func(y string) {
		if err := os.WriteFile(filepath.Join(dir, "gw.yaml"), []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		hup <- os.Interrupt // any value: the channel stands for SIGHUP
		hup <- os.Interrupt // the second send returns once the first reload is done
	}
	write(strings.Replace(perMinute, "120", "30", 1))
	if got := limitOf(); got != 30 {
		t.Fatalf("after a reload: limit %d, want 30", got)
	}
	write("domain: gw\ndescriptors: [{key: api_key, rate_limit: {unit: fortnight}}]")
	if got := limitOf(); got != 30 {
		t.Fatalf("after a bad reload: limit %d, want 30 (the one in force)", got)
	}
	if !strings.Contains(logs.String(), "the one in force stays") || !strings.Contains(logs.String(), "fortnight") {
		t.Fatalf("the bad configuration was not logged:\n%s", logs)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
