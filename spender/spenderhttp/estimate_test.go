package spenderhttp_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// fixedCounter counts every text as n tokens, or fails with err.
func fixedCounter(n int64, err error) spenderhttp.Counter {
	return spenderhttp.CounterFunc(func(context.Context, string, string) (int64, error) { return n, err })
}

func TestEstimateCost(t *testing.T) {
	down := fixedCounter(0, errors.New("tokenizer down"))
	tests := []struct {
		name    string
		counter spenderhttp.Counter
		body    string
		want    int64 // tokens; requests is always 1
	}{
		{"prompt plus max_tokens", fixedCounter(60, nil), `{"model":"m","prompt":"hello","max_tokens":240}`, 300},
		{"max_completion_tokens wins", fixedCounter(60, nil), `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":240,"max_completion_tokens":40}`, 100},
		{"max_completion_tokens wins in any order", fixedCounter(60, nil), `{"max_completion_tokens":40,"model":"m","prompt":"x","max_tokens":240}`, 100},
		{"256 default", fixedCounter(60, nil), `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 316},
		{"null max_tokens is the default", fixedCounter(60, nil), `{"model":"m","prompt":"hi","max_tokens":null}`, 316},
		{"max_tokens 0", fixedCounter(60, nil), `{"model":"m","prompt":"hi","max_tokens":0}`, 60},
		{"integral float max_tokens", fixedCounter(60, nil), `{"model":"m","prompt":"hi","max_tokens":1e2}`, 160},
		{"n choices multiply the completion", fixedCounter(10, nil), `{"model":"m","prompt":"hi","max_tokens":100,"n":3}`, 310},
		{"bytes/4 when the tokenizer fails", down, `{"model":"m","prompt":"0123456789","max_tokens":10}`, 3 + 10},
		{"bytes/4 without a counter", nil, `{"model":"m","prompt":"0123456789abcdef","max_tokens":10}`, 4 + 10},
		{"a count of 0 for text is not trusted", fixedCounter(0, nil), `{"model":"m","prompt":"a","max_tokens":0}`, 1},
		{"non-empty prompt never 0", down, `{"model":"m","prompt":"a","max_tokens":0}`, 1},
		{"chat contents joined", nil, `{"messages":[{"role":"system","content":"abc"},{"role":"user","content":[{"type":"text","text":"defg"},{"type":"image_url","image_url":{"url":"x"}}]}],"max_tokens":0}`, 2},
		{"token ids count directly", fixedCounter(1000, nil), `{"model":"m","prompt":[1,2,3,4,5],"max_tokens":5}`, 10},
		{"batched token ids", fixedCounter(1000, nil), `{"model":"m","prompt":[[1,2],[3]],"max_tokens":0}`, 3},
		{"embeddings input, no completion", fixedCounter(7, nil), `{"model":"e","input":["a","b"]}`, 7},
		{"embeddings token ids", nil, `{"model":"e","input":[5,6,7]}`, 3},
		{"responses max_output_tokens", fixedCounter(7, nil), `{"model":"m","input":"hi","max_output_tokens":50}`, 57},
		{"malformed JSON from its bytes", fixedCounter(1000, nil), `{"model":"m","prompt":"abc`, 7 + 256},
		{"not an object", nil, `[1,2,3]`, 2 + 256},
		{"empty body", fixedCounter(1000, nil), ``, 0},
		{"no prompt at all", fixedCounter(1000, nil), `{"model":"m"}`, 0},
		{"huge max_tokens saturates", fixedCounter(1, nil), `{"prompt":"a","max_tokens":1e300}`, 1 << 40},
		{"huge n is capped", fixedCounter(0, nil), `{"prompt":"abcd","max_tokens":10,"n":1000000}`, 1 + 1280},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := spenderhttp.EstimateCost(context.Background(), tt.counter, []byte(tt.body))
			if want := (ration.Amount{Requests: 1, Tokens: tt.want}); got != want {
				t.Errorf("EstimateCost(%s) = %+v, want %+v", tt.body, got, want)
			}
		})
	}
}

func TestEstimateCostCountsWhatPromptTextReturns(t *testing.T) {
	var gotModel, gotText string
	c := spenderhttp.CounterFunc(func(_ context.Context, model, text string) (int64, error) {
		gotModel, gotText = model, text
		return 1, nil
	})
	body := []byte(`{"model":"llama","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}`)
	spenderhttp.EstimateCost(context.Background(), c, body)
	if gotModel != "llama" || gotText != spenderhttp.PromptText(body) || gotText != "a\nb" {
		t.Errorf("counter got (%q, %q), want (llama, %q)", gotModel, gotText, "a\nb")
	}
}

func FuzzEstimateCost(f *testing.F) {
	for _, s := range []string{
		``, `{}`, `null`, `{"prompt":"x"}`, `{"prompt":[1,2,3],"max_tokens":5}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_completion_tokens":9,"n":2}`,
		`{"input":["a",[1,2]],"max_output_tokens":-1}`, `{"max_tokens":1e309}`, `{"max_tokens":"12"}`,
		`{"prompt":` + strings.Repeat("[", 100) + `1` + strings.Repeat("]", 100) + `}`,
		`{"messages":[{"content":{"content":{"content":"deep"}}}]}`, "{\"prompt\":\"\xff\xfe\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got := spenderhttp.EstimateCost(context.Background(), nil, body)
		if got.Requests != 1 || got.Tokens < 0 || got.Tokens > 1<<42 {
			t.Fatalf("EstimateCost(%q) = %+v", body, got)
		}
		if spenderhttp.PromptText(body) != "" && got.Tokens == 0 {
			t.Fatalf("EstimateCost(%q) = 0 tokens for a non-empty prompt", body)
		}
		// Counting with a tokenizer never gives fewer tokens than the
		// directly counted ids plus at least one per non-empty text.
		withCounter := spenderhttp.EstimateCost(context.Background(), fixedCounter(1, nil), body)
		if withCounter.Tokens < 0 {
			t.Fatalf("negative estimate %+v", withCounter)
		}
	})
}
