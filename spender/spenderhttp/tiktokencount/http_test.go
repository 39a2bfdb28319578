package tiktokencount_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/internal/testkit"
	"github.com/rationhq/ration/spender"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// reservations wraps a Reserver and records the cost of each Reserve.
type reservations struct {
	spenderhttp.Reserver
	mu   sync.Mutex
	cost []ration.Amount
}

func (r *reservations) Reserve(ctx context.Context, key string, lim ration.Limits, c ration.Amount) (spender.Reservation, error) {
	r.mu.Lock()
	r.cost = append(r.cost, c)
	r.mu.Unlock()
	return r.Reserver.Reserve(ctx, key, lim, c)
}

func (r *reservations) last() ration.Amount {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cost[len(r.cost)-1]
}

// tokenizeEngine is an engine's /v1/tokenize that counts its calls and
// answers 42 tokens for any text.
func tokenizeEngine(t *testing.T) (url string, calls *atomic.Int64) {
	calls = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/tokenize" {
			http.NotFound(w, r)
			return
		}
		calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"count":42}`)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, calls
}

// TestLimitStageUsesInProcessCount sends chat requests through the limit
// stage (spenderhttp.Middleware) with the in-process counter in front of
// the engine's /v1/tokenize: for a known OpenAI model the reservation is
// the in-process count (the cookbook's chat overhead included) plus
// max_tokens, and the engine's tokenize is not called; for another model
// it is called once and its count reserved.
func TestLimitStageUsesInProcessCount(t *testing.T) {
	engine, calls := tokenizeEngine(t)
	counter := shared.WithNext(spenderhttp.TokenizeCounter{BaseURL: engine})
	res := &reservations{Reserver: testkit.Limiter(t, fakeclock.New())}
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	})
	p := spenderhttp.Principal{KeyID: "k", Limits: ration.Limits{RPM: 1000, TPM: 100000}}
	h := spenderhttp.Middleware(res, counter)(upstream)
	post := func(body string) int {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		req = req.WithContext(spenderhttp.WithPrincipal(req.Context(), p))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	chat := func(model string) string {
		return `{"model":"` + model + `","max_tokens":16,"messages":[` +
			`{"role":"system","content":"You are a helpful assistant."},` +
			`{"role":"user","content":"hello from ration, a rate limiter"}]}`
	}

	for _, tt := range []struct {
		model string
		want  int64
	}{
		// 3 priming + (3 + system 1 + 6) + (3 + user 1 + the sentence) + 16.
		{"gpt-4o", 3 + (3 + 1 + 6) + (3 + 1 + 7) + 16},
		{"gpt-4", 3 + (3 + 1 + 6) + (3 + 1 + 8) + 16},
	} {
		if code := post(chat(tt.model)); code != http.StatusOK {
			t.Fatalf("%s: status %d", tt.model, code)
		}
		if got := res.last(); got != (ration.Amount{Requests: 1, Tokens: tt.want}) {
			t.Errorf("%s: reserved %+v, want 1 request and %d tokens", tt.model, got, tt.want)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("the engine's /v1/tokenize was called %d times for known OpenAI models, want 0", n)
	}

	if code := post(chat("llama-3-8b")); code != http.StatusOK {
		t.Fatalf("llama: status %d", code)
	}
	if got := res.last(); got != (ration.Amount{Requests: 1, Tokens: 42 + 16}) {
		t.Errorf("llama: reserved %+v, want the engine's 42 + 16 tokens", got)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the engine's /v1/tokenize was called %d times for one unknown model, want 1", n)
	}
}
