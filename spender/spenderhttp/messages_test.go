package spenderhttp_test

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"

	"github.com/rationhq/ration/spender/spenderhttp"
)

// messageCounter counts messages as perMessage each (or fails with err)
// and text as len(text) tokens, and records what it was asked.
type messageCounter struct {
	perMessage int64
	err        error

	mu    sync.Mutex
	msgs  [][]spenderhttp.ChatMessage
	texts []string
}

func (c *messageCounter) CountTokens(_ context.Context, _, text string) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.texts = append(c.texts, text)
	return int64(len(text)), nil
}

func (c *messageCounter) CountMessages(_ context.Context, _ string, msgs []spenderhttp.ChatMessage) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, msgs)
	return c.perMessage * int64(len(msgs)), c.err
}

func TestEstimateCostMessageCounter(t *testing.T) {
	tests := []struct {
		name      string
		counter   *messageCounter
		body      string
		want      int64 // tokens
		wantMsgs  []spenderhttp.ChatMessage
		wantTexts []string // what CountTokens was asked
	}{
		{
			name:    "messages counted with their roles and names",
			counter: &messageCounter{perMessage: 10},
			body: `{"model":"m","max_tokens":5,"messages":[{"role":"system","content":"be brief"},` +
				`{"role":"user","name":"ann","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"here"}]},` +
				`{"role":"assistant","content":null,"tool_calls":[]}]}`,
			want: 30 + 5,
			wantMsgs: []spenderhttp.ChatMessage{
				{Role: "system", Content: "be brief"},
				{Role: "user", Name: "ann", Content: "look\nhere"},
				{Role: "assistant"},
			},
		},
		{
			name:      "a failing CountMessages falls back to CountTokens of the joined text",
			counter:   &messageCounter{perMessage: 10, err: errors.New("unknown model")},
			body:      `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"abc"},{"role":"user","content":"de"}]}`,
			want:      6, // "abc\nde"
			wantMsgs:  []spenderhttp.ChatMessage{{Role: "user", Content: "abc"}, {Role: "user", Content: "de"}},
			wantTexts: []string{"abc\nde"},
		},
		{
			name:      "a count below 1 is not trusted",
			counter:   &messageCounter{perMessage: 0},
			body:      `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"abcd"}]}`,
			want:      4,
			wantMsgs:  []spenderhttp.ChatMessage{{Role: "user", Content: "abcd"}},
			wantTexts: []string{"abcd"},
		},
		{
			name:      "prompt and input beside messages are counted as text and added",
			counter:   &messageCounter{perMessage: 10},
			body:      `{"model":"m","max_tokens":0,"prompt":"pp","messages":[{"role":"user","content":"abc"}],"input":["i1","i2"]}`,
			want:      10 + int64(len("pp\ni1\ni2")),
			wantMsgs:  []spenderhttp.ChatMessage{{Role: "user", Content: "abc"}},
			wantTexts: []string{"pp\ni1\ni2"},
		},
		{
			name:      "no messages: CountTokens only",
			counter:   &messageCounter{perMessage: 10},
			body:      `{"model":"m","max_tokens":0,"prompt":"hello"}`,
			want:      5,
			wantTexts: []string{"hello"},
		},
		{
			name:     "wrong types in a message are ignored, not fatal",
			counter:  &messageCounter{perMessage: 7},
			body:     `{"model":"m","max_tokens":0,"messages":[{"role":5,"name":["x"],"content":"hi"}]}`,
			want:     7,
			wantMsgs: []spenderhttp.ChatMessage{{Content: "hi"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := spenderhttp.EstimateCost(context.Background(), tt.counter, []byte(tt.body))
			if got.Requests != 1 || got.Tokens != tt.want {
				t.Errorf("EstimateCost = %+v, want 1 request, %d tokens", got, tt.want)
			}
			var msgs []spenderhttp.ChatMessage
			if len(tt.counter.msgs) > 0 {
				msgs = tt.counter.msgs[0]
			}
			if len(tt.counter.msgs) > 1 || !reflect.DeepEqual(msgs, tt.wantMsgs) {
				t.Errorf("CountMessages asked %q, want once with %q", tt.counter.msgs, tt.wantMsgs)
			}
			if !reflect.DeepEqual(tt.counter.texts, tt.wantTexts) {
				t.Errorf("CountTokens asked %q, want %q", tt.counter.texts, tt.wantTexts)
			}
		})
	}
}

// TestPromptTextUnchangedByMessageCounting: PromptText still joins every
// message's text with the prompt and input, in body order.
func TestPromptTextUnchangedByMessageCounting(t *testing.T) {
	body := `{"prompt":"p","messages":[{"role":"user","name":"n","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"input":"i"}`
	if got, want := spenderhttp.PromptText([]byte(body)), "p\na\nb\ni"; got != want {
		t.Errorf("PromptText = %q, want %q", got, want)
	}
}
