package spenderhttp_test

import (
	"context"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/testkit"
	"github.com/rationhq/ration/spender"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// inOut is a key with 10 RPM and separate input and output token limits
// per minute, as Anthropic's ITPM and OTPM.
func inOut() spenderhttp.Principal {
	return spenderhttp.Principal{KeyID: "k", Limits: ration.Limits{RPM: 10}, Budgets: []spenderhttp.Budget{
		{Key: "k/in", Scope: "key", Limits: ration.Limits{TPM: 1000}, Meter: spenderhttp.InputTokens},
		{Key: "k/out", Scope: "key", Limits: ration.Limits{TPM: 500}, Meter: spenderhttp.OutputTokens},
	}}
}

// prompt is a chat request whose prompt is n bytes (n/4 tokens without a
// counter) with max_tokens out.
func prompt(n int, out int) string {
	return `{"model":"m","max_tokens":` + strconv.Itoa(out) + `,"messages":[{"role":"user","content":"` + strings.Repeat("x", n) + `"}]}`
}

// TestInputAndOutputLimits: a long prompt is refused on input tokens while
// output has room, and a large completion on output tokens while input
// has room; nothing is charged by a refusal; the Anthropic headers report
// requests, input and output tokens as Anthropic documents them.
func TestInputAndOutputLimits(t *testing.T) {
	clk := newClock()
	l := testkit.Limiter(t, clk)
	h := authed(inOut(), spenderhttp.Middleware(l, nil, spenderhttp.WithAnthropicHeaders(), spenderhttp.WithClock(clk))(jsonHandler(200,
		`{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":700,"completion_tokens":300,"total_tokens":1000}}`)))

	// 2800 bytes: 700 input tokens; 300 output tokens.
	w := do(h, prompt(2800, 300))
	if w.Code != 200 {
		t.Fatalf("first request: %d %s", w.Code, w.Body)
	}
	for name, want := range map[string]string{
		"anthropic-ratelimit-requests-limit":          "10",
		"anthropic-ratelimit-requests-remaining":      "9",
		"anthropic-ratelimit-input-tokens-limit":      "1000",
		"anthropic-ratelimit-input-tokens-remaining":  "300",
		"anthropic-ratelimit-output-tokens-limit":     "500",
		"anthropic-ratelimit-output-tokens-remaining": "200",
		// The most restrictive token limit in effect: output.
		"anthropic-ratelimit-tokens-limit":     "500",
		"anthropic-ratelimit-tokens-remaining": "200",
	} {
		if got := w.Header().Get(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	if reset := w.Header().Get("anthropic-ratelimit-input-tokens-reset"); !strings.HasSuffix(reset, "Z") {
		t.Errorf("input reset %q: want an RFC 3339 instant in UTC", reset)
	}
	if w.Header().Get("x-ratelimit-limit-tokens") != "" {
		t.Errorf("x-ratelimit-limit-tokens %q: no budget counts all tokens", w.Header().Get("x-ratelimit-limit-tokens"))
	}

	// Input short (300 left), output has room (200 left, asking 100).
	w = do(h, prompt(2000, 100)) // 500 input tokens
	if w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), "input tokens per min (ITPM)") {
		t.Fatalf("long prompt: %d %s; want 429 on input tokens", w.Code, w.Body)
	}
	if w.Header().Get("Retry-After") == "" {
		t.Error("no Retry-After")
	}
	// Output short, input has room.
	w = do(h, prompt(40, 400))
	if w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), "output tokens per min (OTPM)") {
		t.Fatalf("long completion: %d %s; want 429 on output tokens", w.Code, w.Body)
	}
	// Neither refusal charged anything: 9 requests left, input 300, output 200.
	w = do(h, prompt(40, 10))
	if w.Code != 200 || w.Header().Get("anthropic-ratelimit-requests-remaining") != "8" ||
		w.Header().Get("anthropic-ratelimit-input-tokens-remaining") != "290" ||
		w.Header().Get("anthropic-ratelimit-output-tokens-remaining") != "190" {
		t.Errorf("after two refusals: %d, headers %v; want 8 requests, 290 input, 190 output left", w.Code, w.Header())
	}
}

// TestBudgetsSettleEachMeter: usage settles each budget with its own count:
// the input budget with prompt_tokens, the output budget with
// completion_tokens, the key's total with total_tokens.
func TestBudgetsSettleEachMeter(t *testing.T) {
	clk := newClock()
	l := testkit.Limiter(t, clk)
	p := inOut()
	p.Limits.TPM = 10_000
	h := authed(p, spenderhttp.Middleware(l, nil, spenderhttp.WithAnthropicHeaders(), spenderhttp.WithClock(clk))(jsonHandler(200,
		`{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":30,"completion_tokens":70,"total_tokens":100}}`)))
	do(h, prompt(400, 200)) // reserved 100 in, 200 out, 300 total
	w := do(h, prompt(4, 1))
	if got := w.Header().Get("anthropic-ratelimit-input-tokens-remaining"); got != "969" { // 1000-30-1
		t.Errorf("input remaining %s; want 969 (the first request settled at 30)", got)
	}
	if got := w.Header().Get("anthropic-ratelimit-output-tokens-remaining"); got != "429" { // 500-70-1
		t.Errorf("output remaining %s; want 429 (settled at 70)", got)
	}
	if got := w.Header().Get("x-ratelimit-remaining-tokens"); got != "9898" { // 10000-100-2
		t.Errorf("total remaining %s; want 9898 (settled at 100)", got)
	}
}

// TestTeamBudgetSharedByKeys: two keys of one team; the team's budget
// refuses, names itself, and charges neither key; the OpenAI headers
// report the tightest budget.
func TestTeamBudgetSharedByKeys(t *testing.T) {
	clk := newClock()
	l := testkit.Limiter(t, clk)
	team := spenderhttp.Budget{Key: "team:acme", Scope: "team", Limits: ration.Limits{RPM: 3}}
	next := jsonHandler(200, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	a := authed(spenderhttp.Principal{KeyID: "a", Limits: ration.Limits{RPM: 10}, Budgets: []spenderhttp.Budget{team}},
		spenderhttp.Middleware(l, nil, spenderhttp.WithIETFHeaders(), spenderhttp.WithClock(clk))(next))
	b := authed(spenderhttp.Principal{KeyID: "b", Limits: ration.Limits{RPM: 10}, Budgets: []spenderhttp.Budget{team}},
		spenderhttp.Middleware(l, nil, spenderhttp.WithClock(clk))(next))
	if w := do(a, chat("")); w.Code != 200 || w.Header().Get("x-ratelimit-remaining-requests") != "2" || w.Header().Get("x-ratelimit-limit-requests") != "3" {
		t.Fatalf("a: %d %v; want the team's 2 of 3 left", w.Code, w.Header())
	} else if pol := w.Header().Get("RateLimit-Policy"); !strings.Contains(pol, `"requests";q=10;w=60`) || !strings.Contains(pol, `"team-requests";q=3;w=60`) {
		t.Errorf("RateLimit-Policy %q; want the key's and the team's policies", pol)
	}
	do(b, chat(""))
	do(a, chat(""))
	w := do(b, chat(""))
	if w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), `of the team budget \"team:acme\"`) || w.Header().Get("Retry-After") != "20" {
		t.Fatalf("4th team request: %d %s Retry-After %q; want 429 naming the team, 20 s", w.Code, w.Body, w.Header().Get("Retry-After"))
	}
	// b spent 1 of its 10: the refusal charged nothing.
	r, err := l.Reserve(context.Background(), "b", ration.Limits{RPM: 10}, ration.Amount{})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Status().RemainingRequests; got != 9 {
		t.Errorf("key b has %d left; want 9 (one admitted, the refusal free)", got)
	}
	clk.Advance(20 * time.Second)
	if w := do(b, chat("")); w.Code != 200 {
		t.Fatalf("after 20 s: %d", w.Code)
	}
}

// TestDecisions: WithDecisions reports each request the stage reserved
// for, before the handler runs, and each one a budget refused, with the
// budget and what it lacked; a request answered before the reservation
// (a body over the cap) is not reported.
func TestDecisions(t *testing.T) {
	var got []spenderhttp.Decision
	var handled int
	stage := spenderhttp.Middleware(testkit.Limiter(t, newClock()), nil, spenderhttp.WithMaxBodyBytes(4096),
		spenderhttp.WithDecisions(func(ctx context.Context, d spenderhttp.Decision) {
			if p, ok := spenderhttp.PrincipalFrom(ctx); !ok || p.KeyID != "k" {
				t.Errorf("the decision's context carries %v", p)
			}
			if d.Admitted && handled != 0 {
				t.Error("an admission reported after the handler ran")
			}
			got = append(got, d)
		}))
	h := authed(inOut(), stage(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handled++
		jsonHandler(200, `{"usage":{"prompt_tokens":10,"completion_tokens":10,"total_tokens":20}}`).ServeHTTP(w, r)
	})))
	for _, tc := range []struct {
		body   string
		status int
	}{{prompt(40, 10), 200}, {prompt(40, 600), 429}, {prompt(5000, 10), 413}} {
		if w := do(h, tc.body); w.Code != tc.status {
			t.Fatalf("%d, want %d: %s", w.Code, tc.status, w.Body)
		}
		handled = 0
	}
	want := []spenderhttp.Decision{{Admitted: true}, {Budget: "k/out", Dimension: spender.Tokens}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decisions %+v, want %+v", got, want)
	}
}
