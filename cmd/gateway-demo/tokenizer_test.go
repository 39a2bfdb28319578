package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

func TestParseConfigTokenizer(t *testing.T) {
	none := func(string) string { return "" }
	c, err := parseConfig(nil, none, io.Discard)
	if err != nil || c.tokenizer != tokenizerAuto {
		t.Errorf("default -tokenizer %q, %v; want auto", c.tokenizer, err)
	}
	env := map[string]string{"RATION_DEMO_TOKENIZER": "tiktoken"}
	if c, err := parseConfig(nil, func(k string) string { return env[k] }, io.Discard); err != nil || c.tokenizer != tokenizerTiktoken {
		t.Errorf("env: %q, %v; want tiktoken", c.tokenizer, err)
	}
	if c, err := parseConfig([]string{"-tokenizer", "bytes"}, func(k string) string { return env[k] }, io.Discard); err != nil || c.tokenizer != tokenizerBytes {
		t.Errorf("flag over env: %q, %v; want bytes", c.tokenizer, err)
	}
	for _, ok := range [][]string{
		{"-tokenizer", "engine"},
		{"-tokenizer", "engine", "-upstream", "http://127.0.0.1:8000", "-tokenize", "http://127.0.0.1:8001"},
		{"-tokenizer", "auto", "-tokenize", "http://127.0.0.1:8001"},
		{"-tokenizer", "tiktoken", "-upstream", "http://127.0.0.1:8000"},
	} {
		if _, err := parseConfig(ok, none, io.Discard); err != nil {
			t.Errorf("%v: %v", ok, err)
		}
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"-tokenizer", "hf"}, `-tokenizer "hf": want auto, tiktoken, engine or bytes`},
		{[]string{"-tokenizer", ""}, `-tokenizer "": want`},
		{[]string{"-tokenizer", "engine", "-upstream", "http://127.0.0.1:8000"}, "-tokenizer engine with -upstream needs -tokenize"},
		{[]string{"-tokenizer", "tiktoken", "-tokenize", "http://127.0.0.1:8001"}, "-tokenize is for -tokenizer auto or engine"},
		{[]string{"-tokenizer", "bytes", "-tokenize", "http://127.0.0.1:8001"}, "-tokenizer bytes calls no engine"},
	} {
		if _, err := parseConfig(tt.args, none, io.Discard); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %v, want %q", tt.args, err, tt.want)
		}
	}
}

// fakeEngine answers chat completions with usage and counts its
// /v1/tokenize calls (each counts 5 tokens).
func fakeEngine(t *testing.T) (url string, tokenizes *atomic.Int64) {
	tokenizes = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/tokenize" {
			tokenizes.Add(1)
			_, _ = io.WriteString(w, `{"count":5}`)
			return
		}
		_, _ = io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, tokenizes
}

// TestTokenizerChoosesCounter runs the demo with each -tokenizer in front
// of an engine that counts its /v1/tokenize calls: auto and tiktoken
// count an OpenAI model's prompt in-process (no call), auto and engine
// ask the engine for any other model, engine asks it for every model,
// bytes never.
func TestTokenizerChoosesCounter(t *testing.T) {
	for _, tt := range []struct {
		tokenizer           string
		gpt4o, llama        int64 // tokenize calls for one request of each
		descWant, descAvoid string
	}{
		{tokenizerAuto, 0, 1, "in-process tiktoken for OpenAI models (gpt-4o, gpt-4, ...), else http://", ""},
		{tokenizerTiktoken, 0, 0, "in-process tiktoken", "/v1/tokenize"},
		{tokenizerEngine, 1, 1, "/v1/tokenize, else bytes/4", "tiktoken"},
		{tokenizerBytes, 0, 0, "bytes/4 (-tokenizer bytes)", "tiktoken"},
	} {
		t.Run(tt.tokenizer, func(t *testing.T) {
			engine, tokenizes := fakeEngine(t)
			cfg := testConfig(t, 1, "")
			cfg.upstream, cfg.tokenizer = engine, tt.tokenizer
			if tt.tokenizer == tokenizerAuto || tt.tokenizer == tokenizerEngine {
				cfg.tokenize = engine
			}
			if err := cfg.validate(); err != nil {
				t.Fatal(err)
			}
			f := startFleet(t, cfg, nil)
			for _, m := range []struct {
				model string
				want  int64
			}{{"gpt-4o", tt.gpt4o}, {"llama-3-8b", tt.llama}} {
				before := tokenizes.Load()
				body := `{"model":"` + m.model + `","messages":[{"role":"user","content":"hello from ration"}],"max_tokens":4}`
				req, _ := http.NewRequest(http.MethodPost, f.instances[0].url+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer sk-ration-demo-large")
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("%s: status %d", m.model, resp.StatusCode)
				}
				if got := tokenizes.Load() - before; got != m.want {
					t.Errorf("%s: %d calls to the engine's /v1/tokenize, want %d", m.model, got, m.want)
				}
			}
			var b bytes.Buffer
			f.banner(&b)
			_, line, _ := strings.Cut(b.String(), "prompts     counted by ")
			line, _, _ = strings.Cut(line, "\n")
			if !strings.Contains(line, tt.descWant) || (tt.descAvoid != "" && strings.Contains(line, tt.descAvoid)) {
				t.Errorf("banner's prompts line %q: want %q in it, and not %q", line, tt.descWant, tt.descAvoid)
			}
		})
	}
}
