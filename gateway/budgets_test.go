package gateway_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/echo"
	"github.com/rationhq/ration/gateway"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/internal/testkit"
	"github.com/rationhq/ration/spender/spenderhttp"
)

const exampleKeys = "../cmd/gateway-demo/keys.example.json"

// TestKeysFileBudgets: the object form of the keys file gives each key its
// own extra budgets, its tenant's and its models' (the key's limit on a
// model and the model's cap), with ids that cannot collide with key ids.
func TestKeysFileBudgets(t *testing.T) {
	kr, err := gateway.LoadKeys(exampleKeys)
	if err != nil {
		t.Fatal(err)
	}
	day := 24 * time.Hour
	in, out, total := spenderhttp.InputTokens, spenderhttp.OutputTokens, spenderhttp.TotalTokens
	for _, tc := range []struct {
		secret  string
		budgets []spenderhttp.Budget
		models  map[string][]spenderhttp.Budget
	}{
		{"sk-example-solo", []spenderhttp.Budget{
			{Key: "solo/in", Scope: "key", Limits: ration.Limits{TPM: 12000}, Meter: in},
			{Key: "solo/out", Scope: "key", Limits: ration.Limits{TPM: 4000}, Meter: out},
			{Key: "solo/day", Scope: "key", Limits: ration.Limits{RPM: 2000, TPM: 1_000_000, Window: day}, Meter: total},
		}, map[string][]spenderhttp.Budget{"gpt-4o": {
			{Key: "model:gpt-4o", Scope: "model", Limits: ration.Limits{TPM: 50000}, Meter: total},
			{Key: "model:gpt-4o/out", Scope: "model", Limits: ration.Limits{TPM: 10000}, Meter: out},
		}}},
		{"sk-example-alice", []spenderhttp.Budget{
			{Key: "tenant:acme", Scope: "tenant", Limits: ration.Limits{RPM: 40, TPM: 40000}, Meter: total},
		}, map[string][]spenderhttp.Budget{"gpt-4o": {
			{Key: "alice@gpt-4o", Scope: "key-model", Limits: ration.Limits{RPM: 5, TPM: 8000}, Meter: total},
			{Key: "model:gpt-4o", Scope: "model", Limits: ration.Limits{TPM: 50000}, Meter: total},
			{Key: "model:gpt-4o/out", Scope: "model", Limits: ration.Limits{TPM: 10000}, Meter: out},
		}}},
	} {
		p, ok := kr.Principal(tc.secret)
		if !ok {
			t.Fatalf("%s: no principal", tc.secret)
		}
		if !slices.Equal(p.Budgets, tc.budgets) || len(p.Models) != len(tc.models) || !slices.Equal(p.Models["gpt-4o"], tc.models["gpt-4o"]) {
			t.Errorf("%s: budgets %+v models %+v\nwant %+v %+v", tc.secret, p.Budgets, p.Models, tc.budgets, tc.models)
		}
	}
	// The array form has no tables: a key's Principal is its own limits.
	old, err := gateway.ParseKeys(strings.NewReader(`[{"key":"sk-1","id":"k1","tenant":"t","rpm":6,"tpm":600}]`))
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := old.Principal("sk-1"); p.Budgets != nil || p.Models != nil || p.Limits != (ration.Limits{RPM: 6, TPM: 600}) {
		t.Errorf("array form: %+v; want the key's own limits alone", p)
	}
}

// TestKeysFileBudgetMistakes: bad tables and clashing budget ids are
// refused at load, naming where.
func TestKeysFileBudgetMistakes(t *testing.T) {
	for _, tc := range []struct {
		name, file, want string
	}{
		{"negative tenant tpd", `{"keys":[{"key":"sk-1","id":"k1","tenant":"t","rpm":1,"tpm":1}],"tenants":{"t":{"tpd":-5}}}`, `tenants["t"]: "tpd": -5 outside`},
		{"empty model name", `{"keys":[{"key":"sk-1","id":"k1","tenant":"t","rpm":1,"tpm":1}],"models":{"":{"tpm":5}}}`, `models[""]: empty name`},
		{"unknown rate", `{"keys":[{"key":"sk-1","id":"k1","tenant":"t","rpm":1,"tpm":1}],"models":{"m":{"tpms":5}}}`, `unknown field "tpms"`},
		{"unknown table", `{"keys":[{"key":"sk-1","id":"k1","tenant":"t","rpm":1,"tpm":1}],"teams":{}}`, `unknown field "teams"`},
		{"key model rate", `[{"key":"sk-1","id":"k1","tenant":"t","rpm":1,"tpm":1,"models":{"m":{"otpm":-1}}}]`, `models["m"]: "otpm": -1 outside`},
		{"budget id clash", `{"keys":[{"key":"sk-1","id":"tenant:t","tenant":"","rpm":1,"tpm":1},{"key":"sk-2","id":"k2","tenant":"t","rpm":1,"tpm":1}],"tenants":{"t":{"rpm":5}}}`, `budget id "tenant:t" is the id of entry 0`},
		{"budget id too long", `[{"key":"sk-1","id":"` + strings.Repeat("k", 254) + `","tenant":"","rpm":1,"tpm":1,"itpm":5}]`, `budget id`},
	} {
		_, err := gateway.ParseKeys(strings.NewReader(tc.file))
		var ke *gateway.KeysError
		if !errors.As(err, &ke) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want a KeysError containing %q", tc.name, err, tc.want)
		}
	}
}

// exampleGateway is a gateway on the example keys file, a standalone
// Limiter and the echo engine (which answers any model), on a frozen clock.
func exampleGateway(t *testing.T) http.Handler {
	t.Helper()
	clk := fakeclock.New()
	up := httptest.NewServer(echo.New(echo.WithClock(clk), echo.WithModels("echo", "gpt-4o")))
	t.Cleanup(up.Close)
	u, err := gateway.ParseUpstream(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	kr, err := gateway.LoadKeys(exampleKeys)
	if err != nil {
		t.Fatal(err)
	}
	g, err := gateway.New(kr, testkit.Limiter(t, clk), u, gateway.WithRegistry(prometheus.NewRegistry()),
		gateway.WithLimitOptions(spenderhttp.WithClock(clk)))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// call sends a small chat for model with key and returns the status and
// body.
func call(t *testing.T, g http.Handler, key, model string) (int, string) {
	return callMax(t, g, key, model, 1)
}

// callMax is call with max_tokens maxTokens, and a prompt long enough
// for the echo engine to answer with all of them.
func callMax(t *testing.T, g http.Handler, key, model string, maxTokens int) (int, string) {
	t.Helper()
	content := "hi"
	if maxTokens > 1 {
		content = strings.Repeat("word ", maxTokens)
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"`+model+`","max_tokens":`+strconv.Itoa(maxTokens)+`,"messages":[{"role":"user","content":"`+content+`"}]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	g.ServeHTTP(w, req)
	return w.Code, w.Body.String()
}

// TestExampleKeysFileBudgets: through a gateway on the shipped example
// file, each kind of budget binds where it should: a team budget shared by
// two keys, one key's limit on one model, and the key's own limit.
func TestExampleKeysFileBudgets(t *testing.T) {
	t.Run("team shared by two keys", func(t *testing.T) {
		g := exampleGateway(t)
		admitted := 0
		for i := range 60 { // alice and bob, 30 RPM each, share acme's 40
			key := "sk-example-alice"
			if i%2 == 1 {
				key = "sk-example-bob"
			}
			code, body := call(t, g, key, "echo")
			switch {
			case code == 200:
				admitted++
			case code != 429 || !strings.Contains(body, `the tenant budget \"tenant:acme\"`):
				t.Fatalf("request %d: %d %s", i, code, body)
			}
		}
		if admitted != 40 {
			t.Errorf("alice and bob were admitted %d times; want the tenant's 40", admitted)
		}
	})
	t.Run("one key on one model", func(t *testing.T) {
		g := exampleGateway(t)
		for i := range 5 {
			if code, body := call(t, g, "sk-example-alice", "gpt-4o"); code != 200 {
				t.Fatalf("gpt-4o request %d: %d %s", i, code, body)
			}
		}
		if code, body := call(t, g, "sk-example-alice", "gpt-4o"); code != 429 || !strings.Contains(body, `the key-model budget \"alice@gpt-4o\"`) {
			t.Fatalf("6th gpt-4o request: %d %s; want 429 on alice@gpt-4o", code, body)
		}
		if code, body := call(t, g, "sk-example-alice", "echo"); code != 200 {
			t.Errorf("another model: %d %s; want 200", code, body)
		}
		if code, body := call(t, g, "sk-example-bob", "gpt-4o"); code != 200 {
			t.Errorf("bob on gpt-4o: %d %s; want 200 (alice's limit is hers)", code, body)
		}
	})
	t.Run("a model's cap over every key", func(t *testing.T) {
		g := exampleGateway(t)
		// gpt-4o's output tokens are capped at 10000 a minute over every
		// key: four completions of 2500 from bob spend them.
		for i := range 4 {
			if code, body := callMax(t, g, "sk-example-bob", "gpt-4o", 2500); code != 200 {
				t.Fatalf("bob's gpt-4o request %d: %d %s", i, code, body)
			}
		}
		for _, key := range []string{"sk-example-bob", "sk-example-alice"} {
			code, body := callMax(t, g, key, "gpt-4o", 2500)
			if code != 429 || !strings.Contains(body, `output tokens per min (OTPM) of the model budget \"model:gpt-4o/out\"`) {
				t.Fatalf("%s on gpt-4o after the cap is spent: %d %s; want 429 on the model's output tokens", key, code, body)
			}
		}
		if code, body := callMax(t, g, "sk-example-bob", "echo", 2500); code != 200 {
			t.Errorf("bob on another model: %d %s", code, body)
		}
	})
	t.Run("the key's own limit", func(t *testing.T) {
		g := exampleGateway(t)
		for i := range 20 {
			if code, body := call(t, g, "sk-example-solo", "echo"); code != 200 {
				t.Fatalf("request %d: %d %s", i, code, body)
			}
		}
		if code, body := call(t, g, "sk-example-solo", "echo"); code != 429 || !strings.Contains(body, "requests per min (RPM)") {
			t.Fatalf("21st: %d %s; want 429 on the key's RPM", code, body)
		}
	})
}
