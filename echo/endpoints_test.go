package echo_test

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rationhq/ration/echo"
	"github.com/rationhq/ration/spender/spenderhttp"
)

func TestCompletions(t *testing.T) {
	e := newEngine()
	tests := []struct {
		name  string
		body  string
		texts []string
		fins  []string
		usage usage
	}{
		{"string", `{"model":"m","prompt":"the quick brown fox","max_tokens":2}`,
			[]string{"the quick"}, []string{"length"}, usage{4, 2, 6}},
		{"strings with n", `{"model":"m","prompt":["a b","c"],"n":2}`,
			[]string{"a b", "a b", "c", "c"}, []string{"stop", "stop", "stop", "stop"}, usage{3, 6, 9}},
		{"token ids", `{"model":"m","prompt":[101,2023,7]}`,
			[]string{"101 2023 7"}, []string{"stop"}, usage{3, 3, 6}},
		{"arrays of token ids", `{"model":"m","prompt":[[1,2],[3]],"max_tokens":1}`,
			[]string{"1", "3"}, []string{"length", "stop"}, usage{3, 2, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := do(t, e, http.MethodPost, "/v1/completions", tt.body)
			if w.Code != http.StatusOK {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			var a completionAnswer
			decode(t, w, &a)
			if a.Object != "text_completion" || len(a.Choices) != len(tt.texts) {
				t.Fatalf("object %q, %d choices, want %d", a.Object, len(a.Choices), len(tt.texts))
			}
			for i, c := range a.Choices {
				if c.Index != i || c.Text != tt.texts[i] || c.FinishReason == nil || *c.FinishReason != tt.fins[i] {
					t.Errorf("choice %d = %+v, want %q %q", i, c, tt.texts[i], tt.fins[i])
				}
			}
			if a.Usage == nil || *a.Usage != tt.usage {
				t.Errorf("usage %+v, want %+v", a.Usage, tt.usage)
			}
		})
	}
}

func TestCompletionsStream(t *testing.T) {
	w := do(t, newEngine(), http.MethodPost, "/v1/completions",
		`{"model":"m","prompt":"a b c","max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`)
	evs := events(t, w.Body.String())
	var text string
	var fin []string
	var u *usage
	for _, ev := range evs[:len(evs)-1] {
		var c struct {
			completionAnswer
			Usage json.RawMessage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) == 0 {
			u = new(usage)
			_ = json.Unmarshal(c.Usage, u)
			continue
		}
		if string(c.Usage) != "null" {
			t.Errorf("chunk usage %s, want null", c.Usage)
		}
		text += c.Choices[0].Text
		if f := c.Choices[0].FinishReason; f != nil {
			fin = append(fin, *f)
		}
	}
	if text != "a b" || len(fin) != 1 || fin[0] != "length" || evs[len(evs)-1] != "[DONE]" {
		t.Errorf("text %q finishes %q last %q", text, fin, evs[len(evs)-1])
	}
	if u == nil || *u != (usage{3, 2, 5}) {
		t.Errorf("usage %+v, want {3 2 5}", u)
	}
}

func TestEmbeddings(t *testing.T) {
	e := newEngine()
	type answer struct {
		Object string `json:"object"`
		Data   []struct {
			Object    string          `json:"object"`
			Index     int             `json:"index"`
			Embedding json.RawMessage `json:"embedding"`
		} `json:"data"`
		Model string `json:"model"`
		Usage struct {
			PromptTokens int64 `json:"prompt_tokens"`
			TotalTokens  int64 `json:"total_tokens"`
		} `json:"usage"`
	}
	w := do(t, e, http.MethodPost, "/v1/embeddings", `{"model":"emb","input":["hello world","three word text"],"dimensions":8}`)
	var a answer
	decode(t, w, &a)
	if a.Object != "list" || a.Model != "emb" || len(a.Data) != 2 || a.Usage.PromptTokens != 5 || a.Usage.TotalTokens != 5 {
		t.Fatalf("answer %+v", a)
	}
	for i, d := range a.Data {
		var vec []float32
		if err := json.Unmarshal(d.Embedding, &vec); err != nil {
			t.Fatal(err)
		}
		want := echo.Embed([]string{"hello world", "three word text"}[i], 8)
		if len(vec) != 8 || d.Index != i || d.Object != "embedding" {
			t.Fatalf("data %d: %d values, index %d", i, len(vec), d.Index)
		}
		var norm float64
		for j := range vec {
			if vec[j] != want[j] {
				t.Errorf("data %d[%d] = %v, want Embed's %v", i, j, vec[j], want[j])
			}
			norm += float64(vec[j]) * float64(vec[j])
		}
		if math.Abs(norm-1) > 1e-5 {
			t.Errorf("data %d has length² %v, want 1", i, norm)
		}
	}

	// base64 carries the same float32s, little-endian; default dimensions.
	w = do(t, e, http.MethodPost, "/v1/embeddings", `{"model":"emb","input":"hello world","encoding_format":"base64"}`)
	decode(t, w, &a)
	var s string
	if err := json.Unmarshal(a.Data[0].Embedding, &s); err != nil {
		t.Fatal(err)
	}
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(raw) != 4*echo.DefaultDimensions {
		t.Fatalf("base64 %q: %d bytes, %v", s, len(raw), err)
	}
	want := echo.Embed("hello world", echo.DefaultDimensions)
	for j := range want {
		if got := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:])); got != want[j] {
			t.Errorf("base64[%d] = %v, want %v", j, got, want[j])
		}
	}
	if echo.Embed("hello world", 8)[0] == echo.Embed("hello there", 8)[0] {
		t.Error("different texts embed to the same first coordinate")
	}
	if v := echo.Embed("  ", 3); v[0] != 1 || v[1] != 0 || v[2] != 0 {
		t.Errorf("empty text embeds to %v, want the first unit vector", v)
	}
}

func TestModels(t *testing.T) {
	e := newEngine(echo.WithModels("echo", "echo-large"))
	w := do(t, e, http.MethodGet, "/v1/models", "")
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	decode(t, w, &list)
	if list.Object != "list" || len(list.Data) != 2 || list.Data[0].ID != "echo" || list.Data[1].ID != "echo-large" || list.Data[1].Object != "model" {
		t.Errorf("models %+v", list)
	}
	if w := do(t, e, http.MethodGet, "/v1/models/echo-large", ""); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"id":"echo-large"`) {
		t.Errorf("GET one model: %d %s", w.Code, w.Body)
	}
	if w := do(t, e, http.MethodGet, "/v1/models/gpt-9", ""); w.Code != http.StatusNotFound {
		t.Errorf("GET an unknown model: %d %s", w.Code, w.Body)
	}
}

func TestTokenize(t *testing.T) {
	e := newEngine()
	for _, body := range []string{
		`{"model":"echo","text":"hello big  world"}`,
		`{"model":"echo","prompt":"hello big world"}`,
		`{"model":"echo","messages":[{"role":"user","content":"hello big"},{"role":"user","content":"world"}]}`,
	} {
		w := do(t, e, http.MethodPost, "/v1/tokenize", body)
		var a struct {
			Count  int64   `json:"count"`
			Tokens []int64 `json:"tokens"`
		}
		decode(t, w, &a)
		want := []int64{echo.TokenID("hello"), echo.TokenID("big"), echo.TokenID("world")}
		if a.Count != 3 || len(a.Tokens) != 3 || a.Tokens[0] != want[0] || a.Tokens[1] != want[1] || a.Tokens[2] != want[2] {
			t.Errorf("%s: %+v, want count 3 ids %v", body, a, want)
		}
	}
}

// TestTokenizeCounterAgreesWithUsage: spenderhttp.TokenizeCounter pointed
// at the engine counts exactly the prompt_tokens the engine reports, for
// the prompt spenderhttp.PromptText extracts, so the limiter's prompt
// estimate is exact.
func TestTokenizeCounterAgreesWithUsage(t *testing.T) {
	srv := httptest.NewServer(newEngine())
	defer srv.Close()
	counter := spenderhttp.TokenizeCounter{BaseURL: srv.URL, Client: srv.Client()}
	for _, body := range []string{
		`{"model":"echo","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"what is\tration?"}]}]}`,
		`{"model":"echo","prompt":["one two","three"]}`,
		`{"model":"echo","prompt":"  leading and trailing  "}`,
	} {
		n, err := counter.CountTokens(t.Context(), "echo", spenderhttp.PromptText([]byte(body)))
		if err != nil {
			t.Fatal(err)
		}
		path := "/v1/chat/completions"
		if strings.Contains(body, `"prompt"`) {
			path = "/v1/completions"
		}
		var a struct{ Usage usage }
		decode(t, do(t, newEngine(), http.MethodPost, path, body), &a)
		if n != a.Usage.PromptTokens {
			t.Errorf("%s: counter says %d, usage.prompt_tokens %d", body, n, a.Usage.PromptTokens)
		}
	}
}

func TestCountTokensMatchesWords(t *testing.T) {
	for _, s := range []string{"", " ", "a", " a b ", "a\u00a0b", "x\u2003y\tz\n", "\xff \xfe"} {
		if got, want := echo.CountTokens(s), len(echo.Words(s)); got != want {
			t.Errorf("CountTokens(%q) = %d, Words has %d", s, got, want)
		}
	}
}
