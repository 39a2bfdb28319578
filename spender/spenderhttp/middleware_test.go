package spenderhttp_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender/spenderhttp"
)

var fiveHeaders = []string{
	"x-ratelimit-limit-requests",
	"x-ratelimit-remaining-requests",
	"x-ratelimit-limit-tokens",
	"x-ratelimit-remaining-tokens",
	"x-ratelimit-reset-tokens",
}

func TestMiddleware429Headers(t *testing.T) {
	clk := newClock()
	lim := newLimiter(t, clk)
	p := spenderhttp.Principal{KeyID: "k1", Tenant: "t", Limits: ration.Limits{RPM: 2, TPM: 100000}}
	h := authed(p, spenderhttp.Middleware(lim, nil)(jsonHandler(200, `{"usage":{"total_tokens":5}}`)))

	for i, wantRemaining := range []string{"1", "0"} {
		w := do(h, chat(`"max_tokens":10`))
		if w.Code != 200 {
			t.Fatalf("request %d: status %d, want 200", i+1, w.Code)
		}
		for _, name := range fiveHeaders {
			if w.Header().Get(name) == "" {
				t.Errorf("request %d: no %s header on a 200", i+1, name)
			}
		}
		if got := w.Header().Get("x-ratelimit-limit-requests"); got != "2" {
			t.Errorf("request %d: limit-requests %q, want 2", i+1, got)
		}
		if got := w.Header().Get("x-ratelimit-remaining-requests"); got != wantRemaining {
			t.Errorf("request %d: remaining-requests %q, want %s", i+1, got, wantRemaining)
		}
		if got := w.Header().Get("Retry-After"); got != "" {
			t.Errorf("request %d: Retry-After %q on a 200", i+1, got)
		}
	}

	w := do(h, chat(`"max_tokens":10`))
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("third request: status %d, want 429", w.Code)
	}
	if got := w.Header().Get("Retry-After"); got != "30" {
		t.Errorf("Retry-After %q, want 30", got)
	}
	for _, name := range fiveHeaders {
		if w.Header().Get(name) == "" {
			t.Errorf("no %s header on the 429", name)
		}
	}
	if got := w.Header().Get("x-ratelimit-remaining-requests"); got != "0" {
		t.Errorf("429 remaining-requests %q, want 0", got)
	}
	if got := w.Header().Get("Content-Type"); got != "application/json" {
		t.Errorf("429 Content-Type %q", got)
	}
	e := decodeError(t, w.Body.Bytes())
	if e.Error.Type != "rate_limit_error" || e.Error.Code == nil || *e.Error.Code != "rate_limit_exceeded" || e.Error.Param != nil {
		t.Errorf("429 body %s: want type rate_limit_error, code rate_limit_exceeded, param null", w.Body)
	}
	for _, want := range []string{"requests per min (RPM)", "Limit 2", "30s"} {
		if !strings.Contains(e.Error.Message, want) {
			t.Errorf("429 message %q does not say %q", e.Error.Message, want)
		}
	}

	// The wait is exact: one microsecond early is still 429, on time is 200.
	clk.Advance(30*time.Second - time.Microsecond)
	if w := do(h, chat(`"max_tokens":10`)); w.Code != 429 {
		t.Errorf("just before Retry-After: status %d, want 429", w.Code)
	}
	clk.Advance(time.Microsecond)
	if w := do(h, chat(`"max_tokens":10`)); w.Code != 200 {
		t.Errorf("after Retry-After: status %d, want 200", w.Code)
	}
}

func TestMiddlewareSettlesActualUsage(t *testing.T) {
	rec, _ := newRecorder(t)
	p := spenderhttp.Principal{KeyID: "k", Limits: ration.Limits{RPM: 100, TPM: 1000}}
	// Estimate: 40 bytes of prompt = 10 tokens, plus max_tokens 200.
	h := authed(p, spenderhttp.Middleware(rec, nil)(jsonHandler(200,
		`{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":38,"total_tokens":50}}`)))

	w := do(h, chat(`"max_tokens":200`))
	if got := w.Header().Get("x-ratelimit-remaining-tokens"); got != "790" {
		t.Fatalf("first remaining-tokens %q, want 790 (1000 - estimate 210)", got)
	}
	w = do(h, chat(`"max_tokens":200`))
	// 1000 - actual 50 - this estimate 210. Settling the estimate would
	// leave 580.
	if got := w.Header().Get("x-ratelimit-remaining-tokens"); got != "740" {
		t.Errorf("second remaining-tokens %q, want 740: the first request must settle its actual 50 tokens", got)
	}
	if got, want := rec.Reserved()[0], (ration.Amount{Requests: 1, Tokens: 210}); got != want {
		t.Errorf("reserved %+v, want %+v", got, want)
	}
	if got, want := rec.Events()[0], (event{"settle", ration.Amount{Requests: 1, Tokens: 50}}); got != want {
		t.Errorf("first reservation ended with %+v, want %+v", got, want)
	}
}

func TestMiddlewareCancelsOn5xx(t *testing.T) {
	rec, _ := newRecorder(t)
	p := spenderhttp.Principal{KeyID: "k", Limits: ration.Limits{RPM: 1, TPM: 1000}}
	fail := authed(p, spenderhttp.Middleware(rec, nil)(jsonHandler(503,
		`{"error":{"message":"no engine","type":"server_error","param":null,"code":null}}`)))
	ok := authed(p, spenderhttp.Middleware(rec, nil)(jsonHandler(200, `{"usage":{"total_tokens":7}}`)))

	w := do(fail, chat(`"max_tokens":100`))
	if w.Code != 503 {
		t.Fatalf("status %d, want the upstream's 503", w.Code)
	}
	for _, name := range fiveHeaders {
		if w.Header().Get(name) == "" {
			t.Errorf("no %s header on the upstream 503", name)
		}
	}
	if got := rec.Events(); len(got) != 1 || got[0].op != "cancel" {
		t.Fatalf("after the 503: %+v, want one cancel", got)
	}
	// The one-request budget is back: the next request is admitted and
	// sees the full token budget less its own estimate.
	w = do(ok, chat(`"max_tokens":100`))
	if w.Code != 200 {
		t.Fatalf("after a cancelled 503: status %d, want 200", w.Code)
	}
	if got := w.Header().Get("x-ratelimit-remaining-tokens"); got != "890" {
		t.Errorf("remaining-tokens %q, want 890", got)
	}
}

func TestMiddleware5xxWithUsageSettles(t *testing.T) {
	rec, _ := newRecorder(t)
	p := spenderhttp.Principal{KeyID: "k", Limits: ration.Limits{RPM: 10, TPM: 1000}}
	h := authed(p, spenderhttp.Middleware(rec, nil)(jsonHandler(500, `{"usage":{"total_tokens":33}}`)))
	do(h, chat(""))
	if got, want := rec.Events(), []event{{"settle", ration.Amount{Requests: 1, Tokens: 33}}}; !equalEvents(got, want) {
		t.Errorf("events %+v, want %+v", got, want)
	}
}

func equalEvents(a, b []event) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestNoPrincipalPassesThrough(t *testing.T) {
	rec, _ := newRecorder(t)
	var seen []string
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seen = append(seen, string(b))
		w.WriteHeader(200)
	})
	h := spenderhttp.Middleware(rec, nil)(next) // no authentication stage
	body := chat(`"stream":true`)
	for i := range 5 {
		w := do(h, body)
		if w.Code != 200 {
			t.Fatalf("request %d: status %d", i, w.Code)
		}
		for name := range w.Header() {
			if strings.HasPrefix(strings.ToLower(name), "x-ratelimit") || name == "Retry-After" {
				t.Errorf("request %d: header %s without a principal", i, name)
			}
		}
	}
	if len(rec.keys) != 0 {
		t.Errorf("Reserve was called %d times without a principal", len(rec.keys))
	}
	for i, b := range seen {
		if b != body {
			t.Errorf("request %d: handler saw body %q, want it untouched", i, b)
		}
	}
}

func TestMiddlewareKeysByKeyID(t *testing.T) {
	rec, _ := newRecorder(t)
	lim := ration.Limits{RPM: 1, TPM: 1000}
	mw := spenderhttp.Middleware(rec, nil)
	next := jsonHandler(200, `{"usage":{"total_tokens":1}}`)
	ci := authed(spenderhttp.Principal{KeyID: "ci-key", Tenant: "acme", Limits: lim}, mw(next))
	dev := authed(spenderhttp.Principal{KeyID: "dev-key", Tenant: "acme", Limits: lim}, mw(next))

	if w := do(ci, chat("")); w.Code != 200 {
		t.Fatalf("ci first: %d", w.Code)
	}
	if w := do(ci, chat("")); w.Code != 429 {
		t.Fatalf("ci second: %d, want 429", w.Code)
	}
	w := do(dev, chat(""))
	if w.Code != 200 {
		t.Fatalf("dev key of the same tenant: %d, want 200: keys must not share a budget", w.Code)
	}
	if got := w.Header().Get("x-ratelimit-remaining-requests"); got != "0" {
		t.Errorf("dev remaining-requests %q, want 0 (its own budget of 1, now spent)", got)
	}
	for _, k := range rec.keys {
		if k != "ci-key" && k != "dev-key" {
			t.Errorf("reserved against %q, want a key ID", k)
		}
	}
}
