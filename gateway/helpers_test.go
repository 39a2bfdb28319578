package gateway_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rationhq/ration/echo"
	"github.com/rationhq/ration/gateway"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/internal/testkit"
	"github.com/rationhq/ration/spender"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// testKeys: "sk-small" has RPM 2 and TPM 1000, "sk-tokens" TPM 100 only,
// "sk-free" no limits, "sk-mid" TPM 1000 only.
func testKeys(t testing.TB) *gateway.Keyring {
	t.Helper()
	kr, err := gateway.NewKeyring([]gateway.Key{
		{Key: "sk-small", ID: "small", Tenant: "t", RPM: 2, TPM: 1000},
		{Key: "sk-tokens", ID: "tokens", Tenant: "t", TPM: 100},
		{Key: "sk-free", ID: "free", Tenant: "t"},
		{Key: "sk-mid", ID: "mid", Tenant: "t", TPM: 1000},
	})
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// rig is a gateway in front of an upstream, on a frozen clock.
type rig struct {
	url   string
	clock *fakeclock.Clock
}

// newRig starts upstream (nil: the echo engine) and a gateway in front of
// it, counting prompts with the upstream's /v1/tokenize.
func newRig(t testing.TB, upstream http.Handler, opts ...gateway.Option) rig {
	t.Helper()
	clk := fakeclock.New()
	if upstream == nil {
		upstream = echo.New(echo.WithClock(clk))
	}
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	u, err := gateway.ParseUpstream(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	opts = append([]gateway.Option{gateway.WithCounter(spenderhttp.TokenizeCounter{BaseURL: up.URL})}, opts...)
	g, err := gateway.New(testKeys(t), testkit.Limiter(t, clk), u, opts...)
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(g)
	t.Cleanup(gw.Close)
	return rig{url: gw.URL, clock: clk}
}

// post sends body to path with key (none if "") and returns the answer
// with its body read.
func post(t *testing.T, url, key, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	return send(t, req)
}

func send(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	return testkit.Do(t, req)
}

// errorBody decodes an OpenAI error body.
func errorBody(t *testing.T, body string) (typ, code, msg string) {
	t.Helper()
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" {
		t.Fatalf("not an OpenAI error body: %q (%v)", body, err)
	}
	if e.Error.Code != nil {
		code = *e.Error.Code
	}
	return e.Error.Type, code, e.Error.Message
}

func chat(content string, extra string) string {
	b, _ := json.Marshal(content)
	return `{"model":"echo","messages":[{"role":"user","content":` + string(b) + `}]` + extra + `}`
}

// newLimiter is a standalone limiter on a frozen clock.
func newLimiter(t testing.TB) *spender.Limiter { return testkit.Limiter(t, fakeclock.New()) }
