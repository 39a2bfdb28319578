package spenderhttp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// echoHandler records the body it was sent and answers 200 with usage.
type echoHandler struct {
	calls int
	body  string
	req   *http.Request
}

func (e *echoHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	e.calls++
	e.body, e.req = string(b), r
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"usage":{"total_tokens":1}}`)
}

func TestMiddlewareBadInput(t *testing.T) {
	limits := ration.Limits{RPM: 10, TPM: 1000}
	tests := []struct {
		name       string
		principal  spenderhttp.Principal
		body       string
		opts       []spenderhttp.Option
		wantStatus int
		wantType   string // "" when the request is passed on
		wantCode   string
		wantParam  string
		reserves   bool
	}{
		{"body over the cap", spenderhttp.Principal{KeyID: "k", Limits: limits}, chat(""),
			[]spenderhttp.Option{spenderhttp.WithMaxBodyBytes(32)}, 413, "invalid_request_error", "request_too_large", "", false},
		{"body at the cap", spenderhttp.Principal{KeyID: "k", Limits: limits}, `{"prompt":"abc"}`,
			[]spenderhttp.Option{spenderhttp.WithMaxBodyBytes(16)}, 200, "", "", "", true},
		{"negative max_tokens", spenderhttp.Principal{KeyID: "k", Limits: limits}, chat(`"max_tokens":-1`),
			nil, 400, "invalid_request_error", "invalid_value", "max_tokens", false},
		{"negative max_completion_tokens", spenderhttp.Principal{KeyID: "k", Limits: limits}, chat(`"max_completion_tokens":-5`),
			nil, 400, "invalid_request_error", "invalid_value", "max_completion_tokens", false},
		{"malformed JSON passed on", spenderhttp.Principal{KeyID: "k", Limits: limits}, `{"model":"m","messages":[`,
			nil, 200, "", "", "", true},
		{"empty key ID", spenderhttp.Principal{KeyID: "", Limits: limits}, chat(""),
			nil, 401, "invalid_request_error", "invalid_api_key", "", false},
		{"overlong key ID", spenderhttp.Principal{KeyID: strings.Repeat("k", ration.MaxKeyLen+1), Limits: limits}, chat(""),
			nil, 401, "invalid_request_error", "invalid_api_key", "", false},
		{"negative limits", spenderhttp.Principal{KeyID: "k", Limits: ration.Limits{RPM: -1}}, chat(""),
			nil, 403, "invalid_request_error", "invalid_rate_limits", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec, _ := newRecorder(t)
			next := &echoHandler{}
			h := authed(tt.principal, spenderhttp.Middleware(rec, nil, tt.opts...)(next))
			w := do(h, tt.body)
			if w.Code != tt.wantStatus {
				t.Fatalf("status %d, want %d (body %s)", w.Code, tt.wantStatus, w.Body)
			}
			if got := len(rec.Reserved()) > 0; got != tt.reserves {
				t.Errorf("reserved: %v, want %v", got, tt.reserves)
			}
			if tt.wantType == "" {
				if next.calls != 1 || next.body != tt.body {
					t.Errorf("handler got %q (%d calls), want the body passed on untouched", next.body, next.calls)
				}
				return
			}
			if next.calls != 0 {
				t.Errorf("handler ran for a rejected request")
			}
			e := decodeError(t, w.Body.Bytes())
			if e.Error.Type != tt.wantType || e.Error.Code == nil || *e.Error.Code != tt.wantCode || e.Error.Message == "" {
				t.Errorf("body %s, want type %s code %s", w.Body, tt.wantType, tt.wantCode)
			}
			if (tt.wantParam == "") != (e.Error.Param == nil) || (e.Error.Param != nil && *e.Error.Param != tt.wantParam) {
				t.Errorf("param %v, want %q", e.Error.Param, tt.wantParam)
			}
		})
	}
}

func TestMiddlewareDeclaredLengthOverCapIsNotRead(t *testing.T) {
	rec, _ := newRecorder(t)
	h := authed(spenderhttp.Principal{KeyID: "k", Limits: ration.Limits{RPM: 1}},
		spenderhttp.Middleware(rec, nil, spenderhttp.WithMaxBodyBytes(10))(&echoHandler{}))
	body := &countingReader{r: strings.NewReader(strings.Repeat("x", 100))}
	req := httptest.NewRequest(http.MethodPost, "/v1/completions", body)
	req.ContentLength = 100
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != 413 || body.n != 0 {
		t.Errorf("status %d after reading %d bytes, want 413 unread", w.Code, body.n)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestMiddlewareOversizeCost(t *testing.T) {
	rec, _ := newRecorder(t)
	h := authed(spenderhttp.Principal{KeyID: "k", Limits: ration.Limits{RPM: 10, TPM: 1000}},
		spenderhttp.Middleware(rec, nil)(&echoHandler{}))
	w := do(h, chat(`"max_tokens":991`)) // 10 + 991 = 1001 > 1000
	if w.Code != 429 {
		t.Fatalf("status %d, want 429", w.Code)
	}
	if got := w.Header().Get("Retry-After"); got != "" {
		t.Errorf("Retry-After %q on a request that can never fit", got)
	}
	if got := w.Header().Get("x-should-retry"); got != "false" {
		t.Errorf("x-should-retry %q on a request that can never fit, want false", got)
	}
	if got := w.Header().Get("x-ratelimit-limit-tokens"); got != "1000" {
		t.Errorf("limit-tokens %q", got)
	}
	e := decodeError(t, w.Body.Bytes())
	for _, want := range []string{"too large", "tokens per min (TPM)", "Limit 1000", "Requested 1001", "never"} {
		if !strings.Contains(e.Error.Message, want) {
			t.Errorf("message %q does not say %q", e.Error.Message, want)
		}
	}
	if strings.Contains(e.Error.Message, "try again in") {
		t.Errorf("message %q invites a retry", e.Error.Message)
	}
	// 1000 fits.
	if w := do(h, chat(`"max_tokens":990`)); w.Code != 200 {
		t.Errorf("a cost of exactly the limit: status %d, want 200", w.Code)
	}
}

func TestMiddlewareSettlement(t *testing.T) {
	tests := []struct {
		name    string
		handler http.Handler
		want    event
	}{
		{"upstream 4xx spends the request only", jsonHandler(400, `{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}`),
			event{"settle", ration.Amount{Requests: 1}}},
		{"upstream 4xx with usage", jsonHandler(400, `{"usage":{"prompt_tokens":3}}`), event{"settle", ration.Amount{Requests: 1, Tokens: 3}}},
		{"200 without usage: prompt plus output bytes/4", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hello"}}]}`) // 45 bytes
		}), event{"settle", ration.Amount{Requests: 1, Tokens: 10 + 12}}},
		{"handler writes nothing", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}),
			event{"settle", ration.Amount{Requests: 1, Tokens: 10}}},
		{"responses API usage", jsonHandler(200, `{"output":[],"usage":{"input_tokens":4,"output_tokens":5,"total_tokens":9}}`),
			event{"settle", ration.Amount{Requests: 1, Tokens: 9}}},
		{"usage without total", jsonHandler(200, `{"usage":{"prompt_tokens":4,"completion_tokens":5}}`),
			event{"settle", ration.Amount{Requests: 1, Tokens: 9}}},
		{"usage after a large answer", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"data":[`)
			row := `{"embedding":[` + strings.Repeat("0.123456,", 1000) + `0],"note":"\"usage\":{\"total_tokens\":1}"},`
			for range 300 { // about 3 MB, past the whole-answer buffer
				_, _ = io.WriteString(w, row)
			}
			_, _ = io.WriteString(w, `{}],"usage":{"prompt_tokens":77,"total_tokens":77},"\"usage":{"total_tokens":1}}`)
		}), event{"settle", ration.Amount{Requests: 1, Tokens: 77}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec, _ := newRecorder(t)
			h := authed(spenderhttp.Principal{KeyID: "k", Limits: ration.Limits{RPM: 10, TPM: 1000}},
				spenderhttp.Middleware(rec, nil)(tt.handler))
			do(h, chat(`"max_tokens":100`))
			if got := rec.Events(); len(got) != 1 || got[0] != tt.want {
				t.Errorf("events %+v, want [%+v]", got, tt.want)
			}
		})
	}
}

func TestMiddlewarePanicBeforeWritingCancels(t *testing.T) {
	rec, _ := newRecorder(t)
	h := authed(spenderhttp.Principal{KeyID: "k", Limits: ration.Limits{RPM: 1}},
		spenderhttp.Middleware(rec, nil)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			panic(http.ErrAbortHandler)
		})))
	func() {
		defer func() {
			if p := recover(); p != http.ErrAbortHandler {
				t.Errorf("recovered %v, want the handler's panic to propagate", p)
			}
		}()
		do(h, chat(""))
	}()
	if got := rec.Events(); len(got) != 1 || got[0].op != "cancel" {
		t.Errorf("events %+v, want one cancel", got)
	}
}

func TestMiddlewareBoundedOverrun(t *testing.T) {
	tests := []struct {
		name         string
		opts         []spenderhttp.Option
		body         string
		limits       ration.Limits
		wantReserved int64
		wantMax      any // the forwarded max_tokens; nil = not injected
	}{
		{"off by default", nil, chat(""), ration.Limits{TPM: 1000}, 266, nil},
		{"fixed cap", []spenderhttp.Option{spenderhttp.WithBoundedOverrun(100)}, chat(""), ration.Limits{TPM: 1000}, 110, 100.0},
		{"what the budget covers", []spenderhttp.Option{spenderhttp.WithBoundedOverrun(0)}, chat(""), ration.Limits{TPM: 1000},
			266, float64(256 + 1000 - 266)},
		{"budget split over n choices", []spenderhttp.Option{spenderhttp.WithBoundedOverrun(0)}, chat(`"n":2`), ration.Limits{TPM: 1000},
			10 + 512, float64((512 + 1000 - 522) / 2)},
		{"client max is kept", []spenderhttp.Option{spenderhttp.WithBoundedOverrun(100)}, chat(`"max_tokens":7`), ration.Limits{TPM: 1000}, 17, 7.0},
		{"unlimited tokens: nothing to bound", []spenderhttp.Option{spenderhttp.WithBoundedOverrun(0)}, chat(""), ration.Limits{RPM: 5}, 266, nil},
		{"embeddings untouched", []spenderhttp.Option{spenderhttp.WithBoundedOverrun(100)}, `{"input":"abcd"}`, ration.Limits{TPM: 1000}, 1, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec, _ := newRecorder(t)
			next := &echoHandler{}
			h := authed(spenderhttp.Principal{KeyID: "k", Limits: tt.limits}, spenderhttp.Middleware(rec, nil, tt.opts...)(next))
			if w := do(h, tt.body); w.Code != 200 {
				t.Fatalf("status %d", w.Code)
			}
			if got := rec.Reserved()[0].Tokens; got != tt.wantReserved {
				t.Errorf("reserved %d tokens, want %d", got, tt.wantReserved)
			}
			var sent map[string]any
			if err := json.Unmarshal([]byte(next.body), &sent); err != nil {
				t.Fatalf("forwarded body %q: %v", next.body, err)
			}
			if got := sent["max_tokens"]; got != tt.wantMax {
				t.Errorf("forwarded max_tokens %v, want %v", got, tt.wantMax)
			}
			if next.req.ContentLength != int64(len(next.body)) {
				t.Errorf("ContentLength %d for a body of %d bytes", next.req.ContentLength, len(next.body))
			}
		})
	}
}

func TestMiddlewareOptionalHeaders(t *testing.T) {
	clk := newClock()
	lim := newLimiter(t, clk)
	h := authed(spenderhttp.Principal{KeyID: "k", Limits: ration.Limits{RPM: 3, TPM: 1000}},
		spenderhttp.Middleware(lim, nil, spenderhttp.WithAnthropicHeaders(), spenderhttp.WithIETFHeaders(), spenderhttp.WithClock(clk))(&echoHandler{}))
	// The worked example: 300 tokens reserved (10 prompt + 290).
	w := do(h, chat(`"max_tokens":290`))
	want := map[string]string{
		"x-ratelimit-reset-tokens":             "18s",
		"x-ratelimit-reset-requests":           "20s",
		"anthropic-ratelimit-tokens-remaining": "700",
		"anthropic-ratelimit-tokens-reset":     "2026-01-01T00:00:18Z",
		"ratelimit":                            `"requests";r=2;t=20, "tokens";r=700;t=18`,
		"ratelimit-policy":                     `"requests";q=3;w=60, "tokens";q=1000;qu="tokens";w=60`,
	}
	for name, v := range want {
		if got := w.Header().Get(name); got != v {
			t.Errorf("%s = %q, want %q", name, got, v)
		}
	}
}

// reserverFunc is a Reserver made of a function.
type reserverFunc func(ctx context.Context, key string, lim ration.Limits, c ration.Amount) (spender.Reservation, error)

func (f reserverFunc) Reserve(ctx context.Context, key string, lim ration.Limits, c ration.Amount) (spender.Reservation, error) {
	return f(ctx, key, lim, c)
}

// TestMiddlewareKeyRejectedByTheAllocator: a key whose entry the allocator
// refused is the key's configuration at fault, like invalid limits: 403
// invalid_rate_limits, not a 503 that tells the client to come back.
func TestMiddlewareKeyRejectedByTheAllocator(t *testing.T) {
	rej := fmt.Errorf("%w %q: limits.rpm: above the allocator's bound", spender.ErrKeyRejected, "k")
	r := reserverFunc(func(context.Context, string, ration.Limits, ration.Amount) (spender.Reservation, error) {
		return nil, rej
	})
	h := authed(spenderhttp.Principal{KeyID: "k", Limits: ration.Limits{RPM: 10}}, spenderhttp.Middleware(r, nil)(&echoHandler{}))
	w := do(h, chat(""))
	if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), `"invalid_rate_limits"`) {
		t.Fatalf("status %d body %s; want 403 invalid_rate_limits", w.Code, w.Body)
	}
}
