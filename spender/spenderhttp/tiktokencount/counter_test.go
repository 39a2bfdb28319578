package tiktokencount_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/rationhq/ration/spender/spenderhttp"
	"github.com/rationhq/ration/spender/spenderhttp/tiktokencount"
)

// shared is the Counter the tests share, so that each encoding loads
// once for them all; TestConcurrentFirstUse makes its own.
var shared = tiktokencount.New(nil)

// counted is a next counter that counts every text as 1000 tokens and
// records that it was asked.
type counted struct {
	mu    sync.Mutex
	calls int
}

func (c *counted) CountTokens(context.Context, string, string) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	return 1000, nil
}

func (c *counted) Calls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// TestKnownCounts: the brief's sentence, and the strings of OpenAI's
// cookbook "How to count tokens with tiktoken" (sections 3 and 5) with
// the counts it publishes for each encoding.
func TestKnownCounts(t *testing.T) {
	c := shared
	tests := []struct {
		text   string
		cl100k int64 // gpt-4
		o200k  int64 // gpt-4o
	}{
		{"hello from ration, a rate limiter", 8, 7},
		{"tiktoken is great!", 6, 6},
		{"antidisestablishmentarianism", 6, 6},
		{"2 + 2 = 4", 7, 7},
		{"お誕生日おめでとう", 9, 8},
		{"", 0, 0},
	}
	for _, tt := range tests {
		for _, m := range []struct {
			model string
			want  int64
		}{{"gpt-4", tt.cl100k}, {"gpt-4o", tt.o200k}} {
			n, err := c.CountTokens(context.Background(), m.model, tt.text)
			if err != nil || n != m.want {
				t.Errorf("CountTokens(%s, %q) = %d, %v; want %d", m.model, tt.text, n, err, m.want)
			}
		}
	}
	// A special token's text in a prompt is ordinary text, as the API
	// treats a client's text: several tokens, not <|endoftext|>'s one.
	if n, err := c.CountTokens(context.Background(), "gpt-4", "<|endoftext|>"); err != nil || n < 2 {
		t.Errorf("CountTokens(<|endoftext|>) = %d, %v; want it counted as text", n, err)
	}
}

// TestCookbookExample is the example conversation of OpenAI's cookbook
// "How to count tokens with tiktoken", section 6, whose count the
// cookbook checked against the API's usage.prompt_tokens: 129 tokens on
// gpt-3.5-turbo, gpt-4-0613 and gpt-4 (cl100k_base), 124 on gpt-4o and
// gpt-4o-mini (o200k_base).
func TestCookbookExample(t *testing.T) {
	msgs := []spenderhttp.ChatMessage{
		{Role: "system", Content: "You are a helpful, pattern-following assistant that translates corporate jargon into plain English."},
		{Role: "system", Name: "example_user", Content: "New synergies will help drive top-line growth."},
		{Role: "system", Name: "example_assistant", Content: "Things working well together will increase revenue."},
		{Role: "system", Name: "example_user", Content: "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage."},
		{Role: "system", Name: "example_assistant", Content: "Let's talk later when we're less busy about how to do better."},
		{Role: "user", Content: "This late pivot means we don't have time to boil the ocean for the client deliverable."},
	}
	c := shared
	for _, tt := range []struct {
		model string
		want  int64
	}{
		{"gpt-3.5-turbo", 129}, {"gpt-4-0613", 129}, {"gpt-4", 129}, {"gpt-4o", 124}, {"gpt-4o-mini", 124},
	} {
		n, err := c.CountMessages(context.Background(), tt.model, msgs)
		if err != nil || n != tt.want {
			t.Errorf("CountMessages(%s) = %d, %v; want %d, the cookbook's and the API's", tt.model, n, err, tt.want)
		}
	}
}

// TestMessageOverhead pins each part of the chat format's overhead.
func TestMessageOverhead(t *testing.T) {
	c := shared
	ctx := context.Background()
	text, _ := c.CountTokens(ctx, "gpt-4o", "hello from ration, a rate limiter") // 7
	name, _ := c.CountTokens(ctx, "gpt-4o", "ann")
	tests := []struct {
		name string
		msgs []spenderhttp.ChatMessage
		want int64
	}{
		{"one user message", []spenderhttp.ChatMessage{{Role: "user", Content: "hello from ration, a rate limiter"}},
			tiktokencount.ReplyPriming + tiktokencount.TokensPerMessage + 1 + text},
		{"with a name", []spenderhttp.ChatMessage{{Role: "user", Name: "ann", Content: "hello from ration, a rate limiter"}},
			tiktokencount.ReplyPriming + tiktokencount.TokensPerMessage + 1 + text + name + tiktokencount.TokensPerName},
		{"an empty assistant message still costs its frame", []spenderhttp.ChatMessage{{Role: "assistant"}},
			tiktokencount.ReplyPriming + tiktokencount.TokensPerMessage + 1},
		{"an uncommon role is encoded", []spenderhttp.ChatMessage{{Role: "moderator", Content: ""}},
			tiktokencount.ReplyPriming + tiktokencount.TokensPerMessage + 2},
	}
	for _, tt := range tests {
		n, err := c.CountMessages(ctx, "gpt-4o", tt.msgs)
		if err != nil || n != tt.want {
			t.Errorf("%s: CountMessages = %d, %v; want %d", tt.name, n, err, tt.want)
		}
	}
}

func TestEncodingForModel(t *testing.T) {
	tests := []struct{ model, want string }{
		{"gpt-4o", tiktokencount.O200KBase},
		{"gpt-4o-mini", tiktokencount.O200KBase},
		{"gpt-4o-2024-08-06", tiktokencount.O200KBase},
		{"chatgpt-4o-latest", tiktokencount.O200KBase},
		{"gpt-4.1", tiktokencount.O200KBase},
		{"gpt-4.1-nano", tiktokencount.O200KBase},
		{"gpt-4.5-preview", tiktokencount.O200KBase},
		{"gpt-5", tiktokencount.O200KBase},
		{"gpt-5-mini", tiktokencount.O200KBase},
		{"o1", tiktokencount.O200KBase},
		{"o1-mini", tiktokencount.O200KBase},
		{"o3-pro", tiktokencount.O200KBase},
		{"o4-mini", tiktokencount.O200KBase},
		{"gpt-4", tiktokencount.CL100KBase},
		{"gpt-4-0613", tiktokencount.CL100KBase},
		{"gpt-4-turbo", tiktokencount.CL100KBase},
		{"gpt-4-32k", tiktokencount.CL100KBase},
		{"gpt-3.5-turbo", tiktokencount.CL100KBase},
		{"gpt-3.5-turbo-instruct", tiktokencount.CL100KBase},
		{"text-embedding-3-small", tiktokencount.CL100KBase},
		{"text-embedding-3-large", tiktokencount.CL100KBase},
		{"text-embedding-ada-002", tiktokencount.CL100KBase},
		// Not OpenAI's, or not in the table: the next counter's.
		{"", ""},
		{"echo", ""},
		{"llama-3-8b", ""},
		{"gpt-oss-20b", ""},
		{"GPT-4o", ""},
		{"openai/gpt-4o", ""},
		{"text-embedding-ada-001", ""},
		{"gpt-3", ""},
		{"davinci-002", ""},
	}
	for _, tt := range tests {
		if got := tiktokencount.EncodingForModel(tt.model); got != tt.want {
			t.Errorf("EncodingForModel(%q) = %q, want %q", tt.model, got, tt.want)
		}
	}
}

func TestUnknownModelFallsThrough(t *testing.T) {
	ctx := context.Background()
	next := &counted{}
	c := shared.WithNext(next)
	if n, err := c.CountTokens(ctx, "llama-3-8b", "hello"); err != nil || n != 1000 || next.Calls() != 1 {
		t.Errorf("CountTokens(llama) = %d, %v after %d next calls; want the next counter's 1000", n, err, next.Calls())
	}
	if n, err := c.CountTokens(ctx, "gpt-4o", "hello"); err != nil || n != 1 || next.Calls() != 1 {
		t.Errorf("CountTokens(gpt-4o) = %d, %v after %d next calls; want 1 in-process", n, err, next.Calls())
	}
	// A next counter that cannot count messages: CountMessages fails, so
	// that the estimate asks CountTokens, which goes to next.
	msgs := []spenderhttp.ChatMessage{{Role: "user", Content: "hello"}}
	if _, err := c.CountMessages(ctx, "llama-3-8b", msgs); !errors.Is(err, tiktokencount.ErrUnknownModel) {
		t.Errorf("CountMessages(llama) err %v, want ErrUnknownModel", err)
	}
	cost := spenderhttp.EstimateCost(ctx, c, []byte(`{"model":"llama-3-8b","messages":[{"role":"user","content":"hello"}],"max_tokens":1}`))
	if cost.Tokens != 1001 || next.Calls() != 2 {
		t.Errorf("estimate for llama: %+v after %d next calls, want 1000+1 from one next call", cost, next.Calls())
	}
	// A next counter that counts messages is asked for them.
	chained := shared.WithNext(c)
	if n, err := chained.CountMessages(ctx, "gpt-4o", msgs); err != nil || n != 3+3+1+1 {
		t.Errorf("chained CountMessages(gpt-4o) = %d, %v", n, err)
	}
	if _, err := chained.CountMessages(ctx, "llama", msgs); !errors.Is(err, tiktokencount.ErrUnknownModel) {
		t.Errorf("chained CountMessages(llama) err %v, want the next's ErrUnknownModel", err)
	}

	// Without a next counter: an error, and the estimate's bytes/4.
	alone := shared
	if _, err := alone.CountTokens(ctx, "llama-3-8b", "hello"); !errors.Is(err, tiktokencount.ErrUnknownModel) {
		t.Errorf("CountTokens(llama) without next: err %v, want ErrUnknownModel", err)
	}
	if cost := spenderhttp.EstimateCost(ctx, alone, []byte(`{"model":"llama-3-8b","prompt":"12345678","max_tokens":1}`)); cost.Tokens != 2+1 {
		t.Errorf("estimate for llama without next: %+v, want bytes/4 2 + 1", cost)
	}
}

func TestBoundsFallThrough(t *testing.T) {
	ctx := context.Background()
	next := &counted{}
	c := shared.WithNext(next)
	for _, tt := range []struct {
		name, text string
		inProcess  bool
	}{
		{"English at MaxBytes", strings.Repeat("the quick brown fox ", tiktokencount.MaxBytes/20), true},
		{"over MaxBytes", strings.Repeat("the quick brown fox ", tiktokencount.MaxBytes/20+1), false},
		{"a run of letters at MaxRunBytes", strings.Repeat("a", tiktokencount.MaxRunBytes), true},
		{"a run of letters over MaxRunBytes", strings.Repeat("a", tiktokencount.MaxRunBytes+1), false},
		{"a run of spaces over MaxRunBytes", "x" + strings.Repeat(" ", tiktokencount.MaxRunBytes+1) + "x", false},
		{"a run of punctuation over MaxRunBytes", strings.Repeat("=", tiktokencount.MaxRunBytes+1), false},
		{"a run of CJK over MaxRunBytes", strings.Repeat("語", tiktokencount.MaxRunBytes/3+1), false},
		{"digits do not make runs", strings.Repeat("1", 4*tiktokencount.MaxRunBytes), true},
		{"letters broken by digits", strings.Repeat(strings.Repeat("a", 400)+"7", 10), true},
	} {
		before := next.Calls()
		n, err := c.CountTokens(ctx, "gpt-4o", tt.text)
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
		}
		if passed := next.Calls() > before; passed == tt.inProcess || (tt.inProcess && n == 1000) {
			t.Errorf("%s: counted %d, passed to next %v; want in-process %v", tt.name, n, passed, tt.inProcess)
		}
	}
	long := []spenderhttp.ChatMessage{{Role: "user", Content: strings.Repeat("a", tiktokencount.MaxRunBytes+1)}}
	if _, err := shared.CountMessages(ctx, "gpt-4o", long); !errors.Is(err, tiktokencount.ErrTooLarge) {
		t.Errorf("CountMessages with a long run: err %v, want ErrTooLarge", err)
	}
	var many []spenderhttp.ChatMessage
	for range 9 {
		many = append(many, spenderhttp.ChatMessage{Role: "user", Content: strings.Repeat("lorem ipsum ", tiktokencount.MaxBytes/12/8)})
	}
	if _, err := shared.CountMessages(ctx, "gpt-4o", many); !errors.Is(err, tiktokencount.ErrTooLarge) {
		t.Errorf("CountMessages over MaxBytes in all: err %v, want ErrTooLarge", err)
	}
}

func TestCancelledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c := shared
	if _, err := c.CountTokens(ctx, "gpt-4o", "hello"); !errors.Is(err, context.Canceled) {
		t.Errorf("CountTokens err %v, want context.Canceled", err)
	}
	if _, err := c.CountMessages(ctx, "gpt-4o", []spenderhttp.ChatMessage{{Role: "user", Content: "hi"}}); !errors.Is(err, context.Canceled) {
		t.Errorf("CountMessages err %v, want context.Canceled", err)
	}
}

// TestConcurrentFirstUse: many goroutines count on new Counters at once,
// on both encodings, while each encoding is loading; run with -race.
// Every count agrees, and Counters made by WithNext share the loads.
func TestConcurrentFirstUse(t *testing.T) {
	ctx := context.Background()
	base := tiktokencount.New(nil)
	counters := []*tiktokencount.Counter{base, base.WithNext(nil), base.WithNext(&counted{}), tiktokencount.New(nil)}
	msgs := []spenderhttp.ChatMessage{{Role: "system", Content: "be brief"}, {Role: "user", Name: "ann", Content: "hello from ration, a rate limiter"}}
	var wg sync.WaitGroup
	for i := range 16 {
		c := counters[i%len(counters)]
		wg.Go(func() {
			for j := range 20 {
				model := "gpt-4"
				want, wantMsgs := int64(8), int64(3+(3+1+2)+(3+1+8+1+1))
				if (i+j)%2 == 0 {
					model, want, wantMsgs = "gpt-4o", 7, 3+(3+1+2)+(3+1+7+1+1)
				}
				if n, err := c.CountTokens(ctx, model, "hello from ration, a rate limiter"); err != nil || n != want {
					t.Errorf("%s: CountTokens = %d, %v; want %d", model, n, err, want)
					return
				}
				if n, err := c.CountMessages(ctx, model, msgs); err != nil || n != wantMsgs {
					t.Errorf("%s: CountMessages = %d, %v; want %d", model, n, err, wantMsgs)
					return
				}
			}
		})
	}
	wg.Wait()
}

// FuzzCountTokens: whatever the text, a count within the bounds is an
// answer (no error, no panic), at least 1 for non-empty text and at most
// one token per byte of its UTF-8 form (invalid bytes count as U+FFFD, 3
// bytes). The seed corpus runs in every go test.
func FuzzCountTokens(f *testing.F) {
	for _, s := range []string{
		"", "a", "hello from ration, a rate limiter", "<|endoftext|><|fim_prefix|>", "<|endofprompt|>",
		"お誕生日おめでとう", "🦀🦀🦀 emoji", "\u0301\u0301\u0301", "a\u0301b\u0302", "\r\n\r\n  \t\v\f",
		"'s 'T 'RE 'Ve 'm 'LL 'd", "1234567890123", "x/y/z\n/\n", "\xff\xfe\x00bad utf-8", "\x00\x01\x02",
		strings.Repeat("ab ", 200), strings.Repeat(" ", tiktokencount.MaxRunBytes), strings.Repeat("語", 170),
	} {
		f.Add(s)
	}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, text string) {
		for _, model := range []string{"gpt-4", "gpt-4o"} {
			n, err := shared.CountTokens(ctx, model, text)
			if errors.Is(err, tiktokencount.ErrTooLarge) {
				continue
			}
			if err != nil || (text != "" && n < 1) || n > 3*int64(len(text)) {
				t.Fatalf("CountTokens(%s, %q) = %d, %v", model, text, n, err)
			}
		}
	})
}
