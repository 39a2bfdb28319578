package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"
	"connectrpc.com/connect/v2/connectproto"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/testkit"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/proto/ration/lease/v1/leasev1connect"
)

// The tokens of each role in the files testConfig writes (a gateway's
// file also holds other-token).
const (
	testToken      = "s3cret-token"
	testAdminToken = "admin-s3cret"
	testPeerToken  = "peer-s3cret"
)

type testServer struct {
	addr string
	cfg  config
	stop context.CancelFunc
	done chan error
	log  *testkit.SyncBuffer
}

func testConfig(t *testing.T, extra ...string) config {
	t.Helper()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("# spenders\n"+testToken+"\n\nother-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"-listen", "127.0.0.1:0", "-data-dir", filepath.Join(dir, "data"), "-token-file", tokens}
	if slices.Contains(extra, "-cluster-id") {
		args = append(args, "-admin-token-file", writeTokens(t, dir, "admin", testAdminToken),
			"-peer-token-file", writeTokens(t, dir, "peer", testPeerToken))
	}
	args = append(args, extra...)
	cfg, err := parseConfig(args, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// writeTokens writes a token file (mode 600) named name in dir.
func writeTokens(t *testing.T, dir, name string, tokens ...string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(strings.Join(tokens, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func startServer(t *testing.T, cfg config) *testServer {
	t.Helper()
	ts := startServerUnready(t, cfg)
	waitReady(t, "http://"+ts.addr, http.DefaultClient)
	return ts
}

// startServerUnready is startServer waiting only until the lease service
// is up (the log's "allocator: serving"), not for /readyz.
func startServerUnready(t *testing.T, cfg config) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{addr: ln.Addr().String(), cfg: cfg, stop: cancel, done: make(chan error, 1), log: &testkit.SyncBuffer{}}
	go func() { ts.done <- serve(ctx, cfg, ln, newLogger(cfg, ts.log)) }()
	t.Cleanup(func() { ts.shutdown(t) })
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(ts.log.String(), `"allocator: serving"`); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the lease service did not start:\n%s", ts.log.String())
		}
	}
	return ts
}

func (ts *testServer) shutdown(t *testing.T) error {
	t.Helper()
	ts.stop()
	select {
	case err, ok := <-ts.done:
		if ok {
			close(ts.done)
		}
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("server did not stop")
	}
	return nil
}

func waitReady(t *testing.T, base string, hc *http.Client) {
	t.Helper()
	for i := 0; i < 500; i++ {
		resp, err := hc.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(10 * time.Millisecond) // polling a real server's startup, not a clock
	}
	t.Fatal("server never became ready")
}

func leaseClient(hc *http.Client, base string, opts ...connecthttp.Option) leasev1connect.LeaseServiceClient {
	return leasev1connect.NewLeaseServiceClient(connect.NewClient(connecthttp.NewTransport(hc, base, opts...)))
}

func authed(token string) context.Context {
	ctx, info := connect.NewClientContext(context.Background())
	if token != "" {
		info.RequestHeader().Set("Authorization", "Bearer "+token)
	}
	return ctx
}

func acquireReq(spender string, seq uint64, key string) *leasev1.AcquireRequest {
	return &leasev1.AcquireRequest{
		Caller: &leasev1.Caller{SpenderId: spender, Epoch: 1, Sequence: seq},
		Keys: []*leasev1.KeyAcquire{{
			Key: key, Limits: &leasev1.Limits{Rpm: 600, Tpm: 6000},
			Want: &leasev1.Amount{Requests: 1, Tokens: 100}, Held: &leasev1.Amount{},
		}},
	}
}

func TestProtocolsOverH2C(t *testing.T) {
	ts := startServer(t, testConfig(t))
	for i, p := range []struct {
		name string
		opts []connecthttp.Option
	}{{"connect", nil}, {"grpc", []connecthttp.Option{connecthttp.WithGRPC()}}, {"grpcweb", []connecthttp.Option{connecthttp.WithGRPCWeb()}}} {
		c := leaseClient(testkit.H2CClient(), "http://"+ts.addr, p.opts...)
		r, err := c.Acquire(authed(testToken), acquireReq("s-"+p.name, 1, "k"))
		if err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
		g := r.GetKeys()[0]
		if g.GetStatus() != leasev1.GrantStatus_GRANT_STATUS_OK || g.GetGranted().GetTokens() != 100 ||
			g.GetSnapshot().GetTokens().GetRemaining() < int64(6000-100*(i+1)) || // refill on the real clock only adds
			g.GetSnapshot().GetTokens().GetRemaining() >= 6000 || r.GetLeaseTtlUs() != 10_000_000 {
			t.Fatalf("%s: reply %v", p.name, r)
		}
	}
}

func TestTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	ts := startServerTLS(t, testConfig(t, "-tls-cert", certFile, "-tls-key", keyFile), pool)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	c := leaseClient(hc, "https://"+ts.addr, connecthttp.WithGRPC())
	if _, err := c.Acquire(authed(testToken), acquireReq("s", 1, "k")); err != nil {
		t.Fatal(err)
	}
}

func startServerTLS(t *testing.T, cfg config, pool *x509.CertPool) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{addr: ln.Addr().String(), cfg: cfg, stop: cancel, done: make(chan error, 1), log: &testkit.SyncBuffer{}}
	go func() { ts.done <- serve(ctx, cfg, ln, newLogger(cfg, ts.log)) }()
	t.Cleanup(func() { ts.shutdown(t) })
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	waitReady(t, "https://"+ts.addr, hc)
	return ts
}

// selfSigned makes a test CA and a certificate it signed for 127.0.0.1.
func selfSigned(t *testing.T, _ string) (certFile, keyFile string, pool *x509.CertPool) {
	f := testkit.NewTLSFiles(t)
	return f.Cert, f.Key, f.Pool
}

func TestAuth(t *testing.T) {
	ts := startServer(t, testConfig(t))
	c := leaseClient(testkit.H2CClient(), "http://"+ts.addr, connecthttp.WithGRPC())
	for _, tok := range []string{"", "wrong", testToken + "x", "s3cret-toke"} {
		_, err := c.Acquire(authed(tok), acquireReq("s", 1, "k"))
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("token %q: %v, want unauthenticated", tok, err)
		}
	}
	for i, tok := range []string{testToken, "other-token"} {
		if _, err := c.Acquire(authed(tok), acquireReq("s"+strconv.Itoa(i), 1, "k")); err != nil {
			t.Errorf("token %q: %v", tok, err)
		}
	}
	// Each token is a credential: the spender id s0 is the first token's.
	if _, err := c.Acquire(authed("other-token"), acquireReq("s0", 2, "k")); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("the other token under s0: %v, want permission denied", err)
	}
	// A rejected call changed nothing: sequence 1 is the first applied.
	if _, err := c.Acquire(authed(testToken), acquireReq("s0", 2, "k")); err != nil {
		t.Fatal(err)
	}
	r, err := c.Acquire(authed(testToken), acquireReq("s0", 1, "k"))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("stale sequence: %v %v, want failed precondition", r, err)
	}
}

// statusWith sends req with token as its bearer token and returns the
// answer's HTTP status.
func statusWith(t *testing.T, req *http.Request, token string) int {
	t.Helper()
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestQuotaRefusedBeforeRead: through the binary's wiring, once a
// credential's call was refused for its quota, its next Acquire is refused
// before its message is read (a body that does not decode gets
// ResourceExhausted, not InvalidArgument); another credential's is read.
func TestQuotaRefusedBeforeRead(t *testing.T) {
	ts := startServer(t, testConfig(t, "-max-keys-per-credential", "1"))
	c := leaseClient(testkit.H2CClient(), "http://"+ts.addr)
	over := acquireReq("s", 1, "k1")
	over.Keys = append(over.Keys, acquireReq("s", 1, "k2").Keys...)
	if _, err := c.Acquire(authed(testToken), over); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("two keys over a quota of one: %v, want resource exhausted", err)
	}
	garbage := func(token string) int {
		req, err := http.NewRequest(http.MethodPost, "http://"+ts.addr+leasev1connect.LeaseServiceAcquireProcedure, strings.NewReader("\xff\xff not a message"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/proto")
		return statusWith(t, req, token)
	}
	if code := garbage(testToken); code != http.StatusTooManyRequests {
		t.Errorf("a credential at its quota: HTTP %d, want 429 (resource exhausted, before the body is read)", code)
	}
	if code := garbage("other-token"); code != http.StatusBadRequest {
		t.Errorf("another credential: HTTP %d, want 400 (its body is read and refused)", code)
	}
}

// TestLimitsFile: with -limits-file (the gateways' keys file), a call's
// limits are the file's whatever it sends, and a key the file does not
// list is refused naming its field; a bad file stops the start.
func TestLimitsFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "keys.json")
	keys := `{"keys": [{"key": "sk-a", "id": "k", "tenant": "acme", "rpm": 60, "tpm": 0}], "tenants": {"acme": {"rpd": 1000}}}`
	if err := os.WriteFile(file, []byte(keys), 0o600); err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, testConfig(t, "-limits-file", file))
	c := leaseClient(testkit.H2CClient(), "http://"+ts.addr)
	req := acquireReq("s", 1, "k")
	req.Keys[0].Limits = &leasev1.Limits{Rpm: 1_000_000_000_000}
	req.Keys[0].Want = &leasev1.Amount{Requests: 1000}
	r, err := c.Acquire(authed(testToken), req)
	if err != nil {
		t.Fatal(err)
	}
	if g := r.GetKeys()[0]; g.GetGranted().GetRequests() != 60 || g.GetSnapshot().GetRequests().GetLimit() != 60 {
		t.Fatalf("rpm 10^12 against the file's 60: %v", g)
	}
	tenant := acquireReq("s", 2, "tenant:acme/day")
	if _, err := c.Acquire(authed(testToken), tenant); err != nil {
		t.Fatalf("the tenant's per-day budget: %v", err)
	}
	if _, err := c.Acquire(authed(testToken), acquireReq("s", 3, "unlisted")); connect.CodeOf(err) != connect.CodeInvalidArgument ||
		!strings.Contains(err.Error(), "keys[0].key") {
		t.Fatalf("an unlisted key: %v, want invalid argument on keys[0].key", err)
	}
	if err := os.WriteFile(file, []byte(`[{"key": "sk-a", "id": "k"}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := serve(context.Background(), testConfig(t, "-limits-file", file), ln, newLogger(config{}, io.Discard)); err == nil ||
		!strings.Contains(err.Error(), "-limits-file") {
		t.Fatalf("a bad limits file: %v", err)
	}
}

func TestHealthReadyMetrics(t *testing.T) {
	ts := startServer(t, testConfig(t))
	c := leaseClient(testkit.H2CClient(), "http://"+ts.addr)
	if _, err := c.Acquire(authed(testToken), acquireReq("s", 1, "k")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(authed(testToken), &leasev1.AcquireRequest{Caller: &leasev1.Caller{SpenderId: "s", Epoch: 1, Sequence: 2},
		Keys: []*leasev1.KeyAcquire{{Key: "k", Limits: &leasev1.Limits{Tpm: 6000}, Need: &leasev1.Amount{Tokens: 7000}, Demand: &leasev1.Amount{Tokens: 600}}}}); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string][]string{
		"/healthz": {"ok"},
		"/readyz":  {"ready"},
		"/metrics": {
			`ration_allocator_calls_total{code="ok",method="Acquire"} 2`,
			`ration_allocator_granted_total{dimension="tokens"} 100`,
			`ration_allocator_rejections_total{reason="too_large"} 1`,
			`ration_allocator_active_keys 1`,
			`ration_allocator_active_spenders 1`,
			`ration_allocator_key_grants_total{method="Acquire"} 2`,
			`ration_allocator_shared_holdings 1`,
			`ration_allocator_call_duration_seconds_bucket{method="Acquire"`,
			`ration_allocator_commit_duration_seconds_count`,
			`go_goroutines`,
		},
	} {
		resp, err := http.Get("http://" + ts.addr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d", path, resp.StatusCode)
		}
		for _, w := range want {
			if !strings.Contains(string(body), w) {
				t.Errorf("%s lacks %q", path, w)
			}
		}
	}
}

func TestBadInputOverTheWire(t *testing.T) {
	ts := startServer(t, testConfig(t))
	c := leaseClient(testkit.H2CClient(), "http://"+ts.addr, connecthttp.WithGRPC())
	ctx := authed(testToken)
	lim := &leasev1.Limits{Tpm: 6000}
	caller := func(seq uint64) *leasev1.Caller { return &leasev1.Caller{SpenderId: "s", Epoch: 1, Sequence: seq} }
	many := make([]*leasev1.KeyAcquire, 1025)
	for i := range many {
		many[i] = &leasev1.KeyAcquire{Key: "k" + string(rune('a'+i%26)) + strings.Repeat("x", i/26), Limits: lim}
	}
	for _, tc := range []struct {
		name  string
		req   *leasev1.AcquireRequest
		field string
	}{
		{"no caller", &leasev1.AcquireRequest{Keys: []*leasev1.KeyAcquire{{Key: "k", Limits: lim}}}, "caller.spender_id"},
		{"empty key", &leasev1.AcquireRequest{Caller: caller(1), Keys: []*leasev1.KeyAcquire{{Limits: lim}}}, "keys[0].key"},
		{"long key", &leasev1.AcquireRequest{Caller: caller(1), Keys: []*leasev1.KeyAcquire{{Key: strings.Repeat("k", 257), Limits: lim}}}, "keys[0].key"},
		{"negative amount", &leasev1.AcquireRequest{Caller: caller(1), Keys: []*leasev1.KeyAcquire{{Key: "k", Limits: lim, Want: &leasev1.Amount{Tokens: -1}}}}, "keys[0].want.tokens"},
		{"batch too large", &leasev1.AcquireRequest{Caller: caller(1), Keys: many}, "keys"},
		{"limit out of range", &leasev1.AcquireRequest{Caller: caller(1), Keys: []*leasev1.KeyAcquire{{Key: "k", Limits: &leasev1.Limits{Rpm: -5}}}}, "keys[0].limits.rpm"},
	} {
		_, err := c.Acquire(ctx, tc.req)
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != connect.CodeInvalidArgument || !strings.Contains(ce.Message(), tc.field+":") {
			t.Errorf("%s: %v, want invalid argument naming %s", tc.name, err, tc.field)
		}
		// The field also travels as a google.rpc.BadRequest, for the spender.
		if br, ok := detailOf[*errdetails.BadRequest](t, err); !ok || len(br.GetFieldViolations()) != 1 || br.GetFieldViolations()[0].GetField() != tc.field {
			t.Errorf("%s: details %v, want a BadRequest naming %s", tc.name, br, tc.field)
		}
	}
	_, err := c.ReserveAhead(ctx, &leasev1.ReserveAheadRequest{Caller: caller(1), Keys: []*leasev1.KeyReserve{{Key: "k", Limits: lim, MaxWaitUs: -1}}})
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "keys[0].max_wait_us") {
		t.Errorf("negative max wait: %v", err)
	}
	// None of that changed anything: the first valid call sees a full bucket.
	r, err := c.Acquire(ctx, acquireReq("s", 1, "k"))
	if rem := r.GetKeys()[0].GetSnapshot().GetTokens().GetRemaining(); err != nil || rem < 5900 || rem > 5901 {
		t.Fatalf("after bad input: %v %v", r, err)
	}
	// A stale epoch says so in a google.rpc.ErrorInfo, with the latest.
	later := acquireReq("s", 1, "k")
	later.Caller.Epoch = 7
	if _, err := c.Acquire(ctx, later); err != nil {
		t.Fatal(err)
	}
	_, err = c.Acquire(ctx, acquireReq("s", 2, "k"))
	info, ok := detailOf[*errdetails.ErrorInfo](t, err)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !ok || info.GetDomain() != ration.ErrorDomain ||
		info.GetReason() != ration.ReasonStaleEpoch || info.GetMetadata()[ration.MetaLatestEpoch] != "7" {
		t.Errorf("stale epoch: %v, details %v; want FailedPrecondition with ErrorInfo %s, latest_epoch 7", err, info, ration.ReasonStaleEpoch)
	}
}

// detailOf returns err's first error detail of type M.
func detailOf[M proto.Message](t *testing.T, err error) (M, bool) {
	t.Helper()
	var zero M
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return zero, false
	}
	for _, d := range ce.Details() {
		m, err := connectproto.UnmarshalErrorDetail(d)
		if err != nil {
			t.Errorf("undecodable detail %s: %v", d.Type, err)
			continue
		}
		if m, ok := m.(M); ok {
			return m, true
		}
	}
	return zero, false
}

func TestGracefulShutdownDrainsInFlightCalls(t *testing.T) {
	// Every commit takes 300 ms more: the calls are in flight when SIGTERM
	// (here: the context) arrives.
	cfg := testConfig(t)
	cfg.onCommit = func() { time.Sleep(300 * time.Millisecond) }
	ts := startServer(t, cfg)
	c := leaseClient(testkit.H2CClient(), "http://"+ts.addr)
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		go func() {
			_, err := c.Acquire(authed(testToken), acquireReq("s"+string(rune('0'+i)), 1, "k"))
			errs <- err
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(ts.log.String(), "ready") && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // let the calls reach the server; they now wait for the commit
	if err := ts.shutdown(t); err != nil {
		t.Fatalf("serve: %v", err)
	}
	for i := 0; i < 4; i++ {
		if err := <-errs; err != nil {
			t.Errorf("in-flight call: %v", err)
		}
	}
	if !strings.Contains(ts.log.String(), "allocator: stopped") {
		t.Fatalf("log: %s", ts.log.String())
	}
	// The store was closed: it opens again at once, with the drained calls in it.
	cfg.onCommit = nil
	ts2 := startServer(t, cfg)
	r, err := leaseClient(testkit.H2CClient(), "http://"+ts2.addr).Acquire(authed(testToken), acquireReq("s0", 1, "k"))
	if err != nil || r.GetKeys()[0].GetGranted().GetTokens() != 100 {
		t.Fatalf("retry after restart: %v %v", r, err)
	}
	_ = slog.LevelInfo
}

func TestConfigFromEnvironmentAndErrors(t *testing.T) {
	env := map[string]string{"RATION_LEASE_TTL": "3s", "RATION_STRICT": "true", "RATION_NO_AUTH": "true", "RATION_LISTEN": "127.0.0.1:9"}
	cfg, err := parseConfig([]string{"-listen", "127.0.0.1:0"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.leaseTTL != 3*time.Second || !cfg.strict || !cfg.noAuth || cfg.listen != "127.0.0.1:0" || cfg.sweepInterval != 3*time.Second {
		t.Fatalf("config %+v", cfg)
	}
	for _, args := range [][]string{
		{},                                   // no token file
		{"-no-auth", "-token-file", "x"},     // both
		{"-no-auth", "-tls-cert", "c"},       // cert without key
		{"-no-auth", "-lease-ttl", "2h"},     // ttl range
		{"-no-auth", "-log-level", "loud"},   // level
		{"-no-auth", "-commit-linger", "1s"}, // linger range
		{"-no-auth", "extra"},                // stray argument
	} {
		if _, err := parseConfig(args, func(string) string { return "" }, io.Discard); err == nil {
			t.Errorf("args %q accepted", args)
		}
	}
	if _, err := parseConfig(nil, func(k string) string { return map[string]string{"RATION_LEASE_TTL": "soon"}[k] }, io.Discard); err == nil {
		t.Error("bad environment value accepted")
	}
}

// With only a header timeout, idle keep-alive
// connections stayed open for good.
func TestIdleConnectionsAreClosed(t *testing.T) {
	ts := startServer(t, testConfig(t, "-idle-timeout", "300ms", "-read-header-timeout", "300ms"))
	took := testkit.IdleConns(t, ts.addr, 200, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 5*time.Second)
	t.Logf("200 idle connections closed within %v", took)
}

// A body shorter than its Content-Length is answered (or the connection
// closed) once the read timeout passes, never a 5xx.
func TestSlowBodyIsCut(t *testing.T) {
	ts := startServer(t, testConfig(t, "-read-timeout", "500ms"))
	head := "POST /ration.lease.v1.LeaseService/Acquire HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + testToken +
		"\r\nContent-Type: application/proto\r\nContent-Length: 500\r\n\r\n"
	start := time.Now()
	code := testkit.SlowBody(t, ts.addr, head, strings.Repeat("\x00", 80), 5*time.Second)
	if code != http.StatusRequestTimeout && code != 0 {
		t.Errorf("status %d for a slow body, want 408 or a closed connection", code)
	}
	t.Logf("status %d after %v", code, time.Since(start))
}
