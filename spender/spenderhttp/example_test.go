package spenderhttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/spender"
	"github.com/rationhq/ration/spender/spenderhttp"
)

func Example() {
	limiter, err := spender.New(fakeclock.New()) // a clock that stands still, so the output is fixed
	if err != nil {
		panic(err)
	}
	// counter would be spenderhttp.TokenizeCounter{BaseURL: engineURL};
	// nil estimates prompts at bytes/4.
	limit := spenderhttp.Middleware(limiter, nil)

	// The upstream: answers with the usage the engine reported.
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"message":{"content":"Hi!"}}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`)
	})
	// The authentication stage: looks the key up and sets the Principal.
	auth := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p := spenderhttp.Principal{KeyID: "key_123", Tenant: "acme", Limits: ration.Limits{RPM: 2, TPM: 1000}}
			next.ServeHTTP(w, r.WithContext(spenderhttp.WithPrincipal(r.Context(), p)))
		})
	}
	gateway := auth(limit(upstream))

	for range 3 {
		body := `{"model":"m","messages":[{"role":"user","content":"Say hi."}],"max_tokens":50}`
		w := httptest.NewRecorder()
		gateway.ServeHTTP(w, httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body)))
		fmt.Println(w.Code,
			"requests left:", w.Header().Get("x-ratelimit-remaining-requests"),
			"tokens left:", w.Header().Get("x-ratelimit-remaining-tokens"),
			"retry-after:", fmt.Sprintf("%q", w.Header().Get("Retry-After")))
	}
	// Output:
	// 200 requests left: 1 tokens left: 948 retry-after: ""
	// 200 requests left: 0 tokens left: 941 retry-after: ""
	// 429 requests left: 0 tokens left: 986 retry-after: "30"
}
