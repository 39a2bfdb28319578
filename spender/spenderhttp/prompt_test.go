package spenderhttp_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/rationhq/ration/spender/spenderhttp"
)

func TestPromptText(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"completions prompt", `{"model":"m","prompt":"Once upon a time"}`, "Once upon a time"},
		{"completions prompt array", `{"prompt":["one","two"]}`, "one\ntwo"},
		{"chat string contents", `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`, "be brief\nhi"},
		{"chat text parts", `{"messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:x"}},{"type":"text","text":"here"}]}]}`, "look\nhere"},
		{"chat null content skipped", `{"messages":[{"role":"assistant","content":null,"tool_calls":[]},{"role":"tool","content":"42"}]}`, "42"},
		{"embeddings input", `{"model":"e","input":"embed me"}`, "embed me"},
		{"embeddings input array", `{"input":["a","b","c"]}`, "a\nb\nc"},
		{"responses input items", `{"input":[{"role":"user","content":[{"type":"input_text","text":"q"}]}]}`, "q"},
		{"token ids have no text", `{"prompt":[1,2,3]}`, ""},
		{"batched token ids have no text", `{"input":[[1,2],[3,4]]}`, ""},
		{"escapes decoded", `{"prompt":"a\nb \u00e9"}`, "a\nb é"},
		{"malformed JSON", `{"prompt":"abc`, ""},
		{"not an object", `"prompt"`, ""},
		{"empty", ``, ""},
		{"no prompt fields", `{"model":"m","temperature":0}`, ""},
		{"wrong types ignored", `{"prompt":5,"messages":{"x":1}}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := spenderhttp.PromptText([]byte(tt.body)); got != tt.want {
				t.Errorf("PromptText(%s) = %q, want %q", tt.body, got, tt.want)
			}
		})
	}
}

func FuzzPromptText(f *testing.F) {
	for _, s := range []string{
		``, `{}`, `{"prompt":"x"}`, `{"prompt":["a","b"]}`, `{"prompt":[1,2]}`,
		`{"messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"content":[{"type":"text","text":"a"},{"type":"image_url"}]}]}`,
		`{"input":"e"}`, `{"input":[{"content":[{"type":"input_text","text":"t"}]}]}`,
		`{"prompt":` + strings.Repeat("[", 50) + strings.Repeat("]", 50) + `}`,
		"{\"prompt\":\"\xff\"}", `{"prompt":"\ud800"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got := spenderhttp.PromptText(body)
		if !utf8.ValidString(got) {
			t.Fatalf("PromptText(%q) = %q is not valid UTF-8", body, got)
		}
		if len(got) > 2*len(body)+16 {
			t.Fatalf("PromptText(%q) is longer (%d) than its body allows", body, len(got))
		}
	})
}
