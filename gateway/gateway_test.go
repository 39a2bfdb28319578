package gateway_test

import (
	"bufio"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rationhq/ration/gateway"
	"github.com/rationhq/ration/spender"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// TestAdmitSettleReject walks one key through the budget with numbers
// predicted from the echo engine's exact usage and its tokenizer: RPM 2,
// TPM 1000, on a frozen clock.
func TestAdmitSettleReject(t *testing.T) {
	r := newRig(t, nil)
	url := r.url + "/v1/chat/completions"
	steps := []struct {
		body                  string
		status                int
		remReq, remTok, retry string
	}{
		// 3 prompt + 2 max = 5 reserved; usage 3+2 = 5 settles exactly.
		{chat("hello big world", `,"max_tokens":2`), 200, "1", "995", ""},
		// 4 + 256 (no max) reserved; usage 4+4 = 8 refunds 252.
		{chat("a b c d", ""), 200, "0", "735", ""},
		// RPM spent: 429 after 30s (one request at 2/min); the tokens show
		// the refund: 1000 - 5 - 8 = 987.
		{chat("x", ""), 429, "0", "987", "30"},
	}
	for i, s := range steps {
		resp, body := post(t, url, "sk-small", s.body)
		h := resp.Header
		if resp.StatusCode != s.status || h.Get("X-Ratelimit-Remaining-Requests") != s.remReq ||
			h.Get("X-Ratelimit-Remaining-Tokens") != s.remTok || h.Get("Retry-After") != s.retry {
			t.Fatalf("step %d: %d remaining %s/%s retry %q, want %d %s/%s %q; body %s", i, resp.StatusCode,
				h.Get("X-Ratelimit-Remaining-Requests"), h.Get("X-Ratelimit-Remaining-Tokens"), h.Get("Retry-After"),
				s.status, s.remReq, s.remTok, s.retry, body)
		}
		if h.Get("X-Ratelimit-Limit-Requests") != "2" || h.Get("X-Ratelimit-Limit-Tokens") != "1000" {
			t.Errorf("step %d: limits %s/%s", i, h.Get("X-Ratelimit-Limit-Requests"), h.Get("X-Ratelimit-Limit-Tokens"))
		}
		if s.status == 429 {
			if typ, code, _ := errorBody(t, body); typ != "rate_limit_error" || code != "rate_limit_exceeded" {
				t.Errorf("429 body %s", body)
			}
		}
	}
	r.clock.Advance(30 * time.Second)
	if resp, body := post(t, url, "sk-small", chat("back", "")); resp.StatusCode != 200 {
		t.Errorf("after Retry-After: %d %s", resp.StatusCode, body)
	}
}

// TestStreamSettlesActualUsage: a stream that did not ask for usage gets
// none, yet the key is charged exactly the usage the engine reported.
func TestStreamSettlesActualUsage(t *testing.T) {
	r := newRig(t, nil)
	url := r.url + "/v1/chat/completions"
	resp, body := post(t, url, "sk-tokens", chat("one two three four", `,"max_tokens":10,"stream":true`))
	if resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Remaining-Tokens") != "86" { // 100 - (4+10)
		t.Fatalf("stream: %d remaining %s", resp.StatusCode, resp.Header.Get("X-Ratelimit-Remaining-Tokens"))
	}
	if strings.Contains(body, `"usage":{`) || !strings.Contains(body, "data: [DONE]") {
		t.Errorf("the client got a usage chunk it did not ask for, or no [DONE]:\n%s", body)
	}
	// Settled at 4+4 = 8: 92 left, minus this request's 1+1.
	resp, _ = post(t, url, "sk-tokens", chat("x", `,"max_tokens":1`))
	if got := resp.Header.Get("X-Ratelimit-Remaining-Tokens"); got != "90" {
		t.Errorf("after the stream: remaining %s, want 90", got)
	}
}

// TestStreamsWithoutBuffering: the first event reaches the client while
// the upstream still holds the rest back.
func TestStreamsWithoutBuffering(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"first\"}}]}\n\n")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" second\"}}]}\n\ndata: [DONE]\n\n")
	})
	r := newRig(t, upstream)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, r.url+"/v1/chat/completions",
		strings.NewReader(chat("hi", `,"stream":true`)))
	req.Header.Set("Authorization", "Bearer sk-free")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	select {
	case l := <-lines:
		if !strings.Contains(l, "first") {
			t.Fatalf("first line %q", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first event did not arrive while the upstream held the rest: the stream is buffered")
	}
	once.Do(func() { close(release) })
	var rest strings.Builder
	for l := range lines {
		rest.WriteString(l + "\n")
	}
	if !strings.Contains(rest.String(), "second") || !strings.Contains(rest.String(), "[DONE]") {
		t.Errorf("rest of the stream: %q", rest.String())
	}
}

func TestUpstreamNeverSeesClientKey(t *testing.T) {
	for _, upKey := range []string{"", "up-secret"} {
		seen := make(chan http.Header, 4)
		upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/chat/completions" {
				seen <- r.Header.Clone()
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
		})
		r := newRig(t, upstream, gateway.WithUpstreamKey(upKey))
		if resp, body := post(t, r.url+"/v1/chat/completions", "sk-free", chat("hi", "")); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		h := <-seen
		want := ""
		if upKey != "" {
			want = "Bearer " + upKey
		}
		if got := h.Get("Authorization"); got != want {
			t.Errorf("upstream key %q: upstream saw Authorization %q, want %q", upKey, got, want)
		}
		if h.Get("X-Forwarded-For") == "" || h.Get("Accept-Encoding") != "identity" {
			t.Errorf("upstream headers %v", h)
		}
	}
}

// TestUpstreamDownIs502AndFree: an unreachable engine is a 502 in the
// OpenAI shape, and the reservation is cancelled.
func TestUpstreamDownIs502AndFree(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	u, _ := gateway.ParseUpstream(dead.URL)
	g, err := gateway.New(testKeys(t), newLimiter(t), u)
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(g)
	defer gw.Close()
	for i := range 3 { // RPM 2: a third admission would be refused if these counted
		resp, body := post(t, gw.URL+"/v1/chat/completions", "sk-small", chat("hi", `,"max_tokens":1`))
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("call %d: %d %s", i, resp.StatusCode, body)
		}
		if typ, code, _ := errorBody(t, body); typ != "server_error" || code != "upstream_unavailable" {
			t.Errorf("502 body %s", body)
		}
		if got := resp.Header.Get("X-Ratelimit-Remaining-Requests"); got != "1" {
			t.Errorf("call %d: remaining requests %s, want 1 (the failed calls are cancelled)", i, got)
		}
	}
}

func TestAuthentication(t *testing.T) {
	r := newRig(t, nil)
	url := r.url + "/v1/chat/completions"
	tests := []struct{ name, auth, code string }{
		{"no header", "", ""},
		{"basic scheme", "Basic c2stc21hbGw6", ""},
		{"empty bearer", "Bearer ", ""},
		{"unknown key", "Bearer sk-nobody-has-this", "invalid_api_key"},
	}
	for _, tt := range tests {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(chat("hi", "")))
		if tt.auth != "" {
			req.Header.Set("Authorization", tt.auth)
		}
		resp, body := send(t, req)
		if resp.StatusCode != 401 || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: %d, WWW-Authenticate %q", tt.name, resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
			continue
		}
		typ, code, _ := errorBody(t, body)
		if typ != "invalid_request_error" || code != tt.code {
			t.Errorf("%s: type %q code %q, want %q", tt.name, typ, code, tt.code)
		}
		if strings.Contains(body, "sk-nobody-has-this") {
			t.Errorf("%s: the answer echoes the key: %s", tt.name, body)
		}
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(chat("hi", "")))
	req.Header.Set("Authorization", "bearer sk-free") // scheme is case-insensitive
	if resp, body := send(t, req); resp.StatusCode != 200 {
		t.Errorf("lower-case scheme: %d %s", resp.StatusCode, body)
	}
}

// TestBadInputNever500: client mistakes are 4xx from the stage that
// knows (auth, limit stage, engine), and never a 500.
func TestBadInputNever500(t *testing.T) {
	r := newRig(t, nil, gateway.WithLimitOptions(spenderhttp.WithMaxBodyBytes(4096)))
	tests := []struct {
		path, body string
		status     int
		code       string
	}{
		{"/v1/chat/completions", chat("x", `,"max_tokens":-1`), 400, "invalid_value"},            // limit stage
		{"/v1/chat/completions", `not json`, 400, ""},                                            // engine
		{"/v1/chat/completions", `{"model":"echo","messages":[]}`, 400, "invalid_value"},         // engine
		{"/v1/chat/completions", chat(strings.Repeat("x ", 3000), ""), 413, "request_too_large"}, // limit stage
		{"/v1/chat/completions", chat("x", `,"max_tokens":1e30`), 429, "rate_limit_exceeded"},    // never fits TPM 1000
		{"/v1/nope", `{}`, 404, "unknown_url"},                                                   // engine
		{"/v1/embeddings", `{"model":"e","input":"a","dimensions":-1}`, 400, "invalid_value"},
	}
	for _, tt := range tests {
		resp, body := post(t, r.url+tt.path, "sk-mid", tt.body)
		if resp.StatusCode != tt.status {
			t.Errorf("%s %.60s: %d, want %d; %s", tt.path, tt.body, resp.StatusCode, tt.status, body)
			continue
		}
		if _, code, _ := errorBody(t, body); code != tt.code {
			t.Errorf("%s %.60s: code %q, want %q", tt.path, tt.body, code, tt.code)
		}
	}
}

func TestModelsAreNotCounted(t *testing.T) {
	r := newRig(t, nil)
	for i := range 4 { // RPM 2
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, r.url+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer sk-small")
		resp, body := send(t, req)
		if resp.StatusCode != 200 || !strings.Contains(body, `"id":"echo"`) || resp.Header.Get("X-Ratelimit-Limit-Requests") != "" {
			t.Fatalf("GET /v1/models #%d: %d %s %v", i, resp.StatusCode, body, resp.Header)
		}
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, r.url+"/v1/models", nil)
	if resp, _ := send(t, req); resp.StatusCode != 401 {
		t.Errorf("GET /v1/models without a key: %d", resp.StatusCode)
	}
}

func TestMetricsAndHealth(t *testing.T) {
	r := newRig(t, nil)
	post(t, r.url+"/v1/chat/completions", "sk-small", chat("hi", ""))
	post(t, r.url+"/v1/chat/completions", "sk-wrong", chat("hi", ""))
	resp, body := send(t, mustGet(t, r.url+"/metrics"))
	for _, want := range []string{
		`ration_gateway_requests_total{code="200",route="/v1/chat/completions"} 1`,
		`ration_gateway_requests_total{code="401",route="/v1/chat/completions"} 1`,
		`ration_gateway_auth_failures_total{reason="unknown"} 1`,
		`ration_gateway_in_flight 0`,
	} {
		if resp.StatusCode != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	if resp, body := send(t, mustGet(t, r.url+"/healthz")); resp.StatusCode != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q", resp.StatusCode, body)
	}
	resp, body = send(t, mustGet(t, r.url+"/nope"))
	if _, code, _ := errorBody(t, body); resp.StatusCode != 404 || code != "unknown_url" {
		t.Errorf("/nope: %d %s", resp.StatusCode, body)
	}
}

// notReady is a limiter whose Ready fails.
type notReady struct {
	spenderhttp.Reserver
	err error
}

func (n notReady) Ready() error { return n.err }

// TestReadyz: /readyz follows the limiter's Ready; a limiter without one
// (the standalone *spender.Limiter always answers nil) is ready.
func TestReadyz(t *testing.T) {
	u, _ := gateway.ParseUpstream("http://127.0.0.1:1")
	for _, tc := range []struct {
		name   string
		lim    spenderhttp.Reserver
		status int
		body   string
	}{
		{"standalone", newLimiter(t), 200, "ready\n"},
		{"ready", notReady{newLimiter(t), nil}, 200, "ready\n"},
		{"unreachable", notReady{newLimiter(t), spender.ErrAllocatorUnreachable}, 503, "not ready: spender: allocator unreachable\n"},
	} {
		g, err := gateway.New(testKeys(t), tc.lim, u, gateway.WithRegistry(prometheus.NewRegistry()))
		if err != nil {
			t.Fatal(err)
		}
		w := httptest.NewRecorder()
		g.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		if w.Code != tc.status || w.Body.String() != tc.body {
			t.Errorf("%s: /readyz %d %q, want %d %q", tc.name, w.Code, w.Body, tc.status, tc.body)
		}
	}
}

func TestNewRejectsBadArguments(t *testing.T) {
	u, _ := gateway.ParseUpstream("http://127.0.0.1:1")
	if _, err := gateway.New(nil, newLimiter(t), u); err == nil {
		t.Error("nil keys accepted")
	}
	if _, err := gateway.New(testKeys(t), nil, u); err == nil {
		t.Error("nil limiter accepted")
	}
	for _, raw := range []string{"", "127.0.0.1:8000", "ftp://x", "http://", "://"} {
		if _, err := gateway.ParseUpstream(raw); err == nil {
			t.Errorf("ParseUpstream(%q) accepted", raw)
		}
	}
	for raw, want := range map[string]string{
		"http://127.0.0.1:8000":       "http://127.0.0.1:8000",
		"http://127.0.0.1:8000/v1":    "http://127.0.0.1:8000",
		"https://h.example/base/v1/":  "https://h.example/base",
		"http://localhost:11434/v1/x": "http://localhost:11434/v1/x",
	} {
		got, err := gateway.ParseUpstream(raw)
		if err != nil || got.String() != want {
			t.Errorf("ParseUpstream(%q) = %v, %v; want %s", raw, got, err, want)
		}
	}
}

func mustGet(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func FuzzGatewayBody(f *testing.F) {
	for _, s := range []string{
		chat("a b", `,"stream":true`), chat("x", `,"max_tokens":-5`), chat("y", `,"n":1000,"max_tokens":1`),
		`{"model":"m","prompt":[1,2,3],"stream":true}`, `{"model":"m","input":["a","b"]}`, `[`, ``, `null`,
		`{"messages":[{"content":[{"type":"text","text":7}]}]}`,
	} {
		f.Add(s)
	}
	r := newRig(f, nil)
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings"} {
			if resp, out := post(t, r.url+path, "sk-free", body); resp.StatusCode >= 500 {
				t.Fatalf("%s %q: %d %s", path, body, resp.StatusCode, out)
			}
		}
	})
}
