package echo_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/rationhq/ration/echo"
)

func TestBadInputIsAClear4xx(t *testing.T) {
	e := newEngine(echo.WithMaxBodyBytes(1024))
	chat, cmpl, emb := "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
	tests := []struct {
		method, path, body string
		status             int
		param              string // "" = null
	}{
		{"POST", chat, ``, 400, ""},
		{"POST", chat, `not json`, 400, ""},
		{"POST", chat, `[1,2]`, 400, ""},
		{"POST", chat, `{"messages":[{"role":"user","content":"x"}]}`, 400, "model"},
		{"POST", chat, `{"model":"m"}`, 400, "messages"},
		{"POST", chat, `{"model":"m","messages":[]}`, 400, "messages"},
		{"POST", chat, `{"model":"m","messages":"hi"}`, 400, "messages"},
		{"POST", chat, `{"model":"m","messages":[{"role":"user","content":5}]}`, 400, "messages[0].content"},
		{"POST", chat, `{"model":"m","messages":[{"role":"user","content":[1]}]}`, 400, "messages[0].content"},
		{"POST", chat, `{"model":"m","messages":[{"content":"x"}],"max_tokens":0}`, 400, "max_tokens"},
		{"POST", chat, `{"model":"m","messages":[{"content":"x"}],"max_tokens":-3}`, 400, "max_tokens"},
		{"POST", chat, `{"model":"m","messages":[{"content":"x"}],"max_tokens":"5"}`, 400, "max_tokens"},
		{"POST", chat, `{"model":"m","messages":[{"content":"x"}],"max_tokens":1.5}`, 400, "max_tokens"},
		{"POST", chat, `{"model":"m","messages":[{"content":"x"}],"max_completion_tokens":0}`, 400, "max_completion_tokens"},
		{"POST", chat, `{"model":"m","messages":[{"content":"x"}],"n":0}`, 400, "n"},
		{"POST", chat, `{"model":"m","messages":[{"content":"x"}],"n":129}`, 400, "n"},
		{"POST", chat, `{"model":"m","messages":[{"content":"x"}],"stream":"yes"}`, 400, "stream"},
		{"POST", chat, `{"model":"m","messages":[{"content":"` + strings.Repeat("x", 2000) + `"}]}`, 413, ""},
		{"GET", chat, ``, 405, ""},
		{"POST", cmpl, `{"model":"m"}`, 400, "prompt"},
		{"POST", cmpl, `{"model":"m","prompt":[]}`, 400, "prompt"},
		{"POST", cmpl, `{"model":"m","prompt":{"a":1}}`, 400, "prompt"},
		{"POST", cmpl, `{"model":"m","prompt":["a","b"],"n":100}`, 400, "n"},
		{"POST", emb, `{"model":"m","input":"x","dimensions":0}`, 400, "dimensions"},
		{"POST", emb, `{"model":"m","input":"x","dimensions":4097}`, 400, "dimensions"},
		{"POST", emb, `{"model":"m","input":"x","encoding_format":"int8"}`, 400, "encoding_format"},
		{"POST", emb, `{"model":"m"}`, 400, "input"},
		{"POST", "/v1/tokenize", `{"model":"m"}`, 400, "text"},
		{"POST", "/v1/models", ``, 405, ""},
		{"DELETE", "/v1/models/echo", ``, 405, ""},
		{"POST", "/v1/responses", `{}`, 404, ""},
		{"GET", "/", ``, 404, ""},
	}
	for _, tt := range tests {
		w := do(t, e, tt.method, tt.path, tt.body)
		name := tt.method + " " + tt.path + " " + tt.body
		if len(name) > 120 {
			name = name[:120]
		}
		if w.Code != tt.status {
			t.Errorf("%s: status %d, want %d; body %s", name, w.Code, tt.status, w.Body)
			continue
		}
		var a apiError
		decode(t, w, &a)
		if a.Error.Message == "" || a.Error.Type != "invalid_request_error" {
			t.Errorf("%s: error %+v", name, a.Error)
		}
		got := ""
		if a.Error.Param != nil {
			got = *a.Error.Param
		}
		if got != tt.param {
			t.Errorf("%s: param %q, want %q", name, got, tt.param)
		}
	}
}

func FuzzEngine(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"a b"}],"stream":true,"n":2}`,
		`{"model":"m","prompt":[[1],[2,3]],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","input":["a"],"dimensions":3,"encoding_format":"base64"}`,
		`{"model":"m","messages":[{"content":[{"type":"text","text":"\u0000"}]}],"max_tokens":1}`,
		`{"text":"x"}`, `null`, `{"model":1}`,
	} {
		f.Add(s)
	}
	e := newEngine(echo.WithMaxBodyBytes(4096))
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/tokenize"} {
			if w := do(t, e, http.MethodPost, path, body); w.Code >= 500 {
				t.Fatalf("%s %q: status %d", path, body, w.Code)
			}
		}
	})
}
