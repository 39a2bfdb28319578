package echo_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rationhq/ration/echo"
)

func TestChatEchoesPromptWithExactUsage(t *testing.T) {
	e := newEngine()
	tests := []struct {
		name        string
		body        string
		wantContent string
		wantFinish  string
		wantChoices int
		wantUsage   usage
	}{
		{
			name:        "no max: whole prompt",
			body:        `{"model":"echo","messages":[{"role":"user","content":"hello  big\nworld"}]}`,
			wantContent: "hello big world", wantFinish: "stop", wantChoices: 1,
			wantUsage: usage{3, 3, 6},
		},
		{
			name: "max_tokens cuts; system and user joined",
			body: `{"model":"m","messages":[{"role":"system","content":"You are terse"},` +
				`{"role":"user","content":"hello big world"}],"max_tokens":4}`,
			wantContent: "You are terse hello", wantFinish: "length", wantChoices: 1,
			wantUsage: usage{6, 4, 10},
		},
		{
			name: "max_completion_tokens wins over max_tokens",
			body: `{"model":"m","messages":[{"role":"user","content":"a b c d e"}],` +
				`"max_tokens":4,"max_completion_tokens":2}`,
			wantContent: "a b", wantFinish: "length", wantChoices: 1,
			wantUsage: usage{5, 2, 7},
		},
		{
			name:        "max equal to the prompt is not a cut",
			body:        `{"model":"m","messages":[{"role":"user","content":"a b c"}],"max_tokens":3}`,
			wantContent: "a b c", wantFinish: "stop", wantChoices: 1,
			wantUsage: usage{3, 3, 6},
		},
		{
			name:        "n choices each count",
			body:        `{"model":"m","messages":[{"role":"user","content":"one two three"}],"max_tokens":2,"n":3}`,
			wantContent: "one two", wantFinish: "length", wantChoices: 3,
			wantUsage: usage{3, 6, 9},
		},
		{
			name: "text parts count, images do not, null content adds nothing",
			body: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"look at"},` +
				`{"type":"image_url","image_url":{"url":"http://x/y.png"}},{"type":"text","text":"this"}]},` +
				`{"role":"assistant","content":null}]}`,
			wantContent: "look at this", wantFinish: "stop", wantChoices: 1,
			wantUsage: usage{3, 3, 6},
		},
		{
			name:        "empty prompt: empty reply",
			body:        `{"model":"m","messages":[{"role":"user","content":"   "}]}`,
			wantContent: "", wantFinish: "stop", wantChoices: 1,
			wantUsage: usage{0, 0, 0},
		},
		{
			name:        "unknown fields are ignored",
			body:        `{"model":"m","messages":[{"role":"user","content":"x y"}],"temperature":0.2,"tools":[]}`,
			wantContent: "x y", wantFinish: "stop", wantChoices: 1,
			wantUsage: usage{2, 2, 4},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := do(t, e, http.MethodPost, "/v1/chat/completions", tt.body)
			if w.Code != http.StatusOK {
				t.Fatalf("status %d, body %s", w.Code, w.Body)
			}
			var a chatAnswer
			decode(t, w, &a)
			if a.Object != "chat.completion" || a.Created != epochUnix || !strings.HasPrefix(a.ID, "chatcmpl-") {
				t.Errorf("object %q created %d id %q", a.Object, a.Created, a.ID)
			}
			if len(a.Choices) != tt.wantChoices {
				t.Fatalf("%d choices, want %d", len(a.Choices), tt.wantChoices)
			}
			for i, c := range a.Choices {
				if c.Index != i || c.Message.Role != "assistant" || c.Message.Content != tt.wantContent || c.FinishReason != tt.wantFinish {
					t.Errorf("choice %d = %+v, want content %q finish %q", i, c, tt.wantContent, tt.wantFinish)
				}
			}
			if a.Usage != tt.wantUsage {
				t.Errorf("usage %+v, want %+v", a.Usage, tt.wantUsage)
			}
		})
	}
}

func TestChatIsDeterministic(t *testing.T) {
	e := newEngine()
	body := `{"model":"echo","messages":[{"role":"user","content":"same same"}]}`
	a := do(t, e, http.MethodPost, "/v1/chat/completions", body).Body.String()
	b := do(t, e, http.MethodPost, "/v1/chat/completions", body).Body.String()
	if a != b {
		t.Errorf("two answers to one body differ:\n%s\n%s", a, b)
	}
	c := do(t, e, http.MethodPost, "/v1/chat/completions", strings.Replace(body, "same same", "other", 1)).Body.String()
	var ida, idc chatAnswer
	_ = json.Unmarshal([]byte(a), &ida)
	_ = json.Unmarshal([]byte(c), &idc)
	if ida.ID == idc.ID {
		t.Errorf("different bodies share the ID %q", ida.ID)
	}
}

func TestChatStream(t *testing.T) {
	e := newEngine()
	tests := []struct {
		name    string
		body    string
		content string
		finish  string
		usage   *usage // nil: no usage chunk, and no usage fields at all
	}{
		{
			name:    "without usage",
			body:    `{"model":"echo","stream":true,"messages":[{"role":"user","content":"one two three"}],"max_tokens":2}`,
			content: "one two", finish: "length",
		},
		{
			name: "with include_usage",
			body: `{"model":"echo","stream":true,"stream_options":{"include_usage":true},` +
				`"messages":[{"role":"user","content":"one two three"}]}`,
			content: "one two three", finish: "stop", usage: &usage{3, 3, 6},
		},
		{
			name: "include_usage false",
			body: `{"model":"echo","stream":true,"stream_options":{"include_usage":false},` +
				`"messages":[{"role":"user","content":"a"}]}`,
			content: "a", finish: "stop",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := do(t, e, http.MethodPost, "/v1/chat/completions", tt.body)
			if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "text/event-stream" {
				t.Fatalf("status %d, Content-Type %q", w.Code, w.Header().Get("Content-Type"))
			}
			evs := events(t, w.Body.String())
			if evs[len(evs)-1] != "[DONE]" {
				t.Fatalf("last event %q, want [DONE]", evs[len(evs)-1])
			}
			var content strings.Builder
			var finishes []string
			var gotUsage *usage
			words := len(strings.Fields(tt.content))
			// role chunk + one per word + finish chunk (+ usage chunk) + [DONE]
			want := 1 + words + 1 + 1
			if tt.usage != nil {
				want++
			}
			if len(evs) != want {
				t.Fatalf("%d events, want %d: %q", len(evs), want, evs)
			}
			for i, ev := range evs[:len(evs)-1] {
				var c chatChunk
				if err := json.Unmarshal([]byte(ev), &c); err != nil {
					t.Fatalf("event %d %q: %v", i, ev, err)
				}
				if c.Object != "chat.completion.chunk" || c.Created != epochUnix {
					t.Errorf("event %d: object %q created %d", i, c.Object, c.Created)
				}
				switch {
				case tt.usage == nil && c.Usage != nil:
					t.Errorf("event %d carries usage %s without include_usage", i, c.Usage)
				case tt.usage != nil && len(c.Choices) > 0 && string(c.Usage) != "null":
					t.Errorf("event %d: usage %s, want null before the usage chunk", i, c.Usage)
				}
				if len(c.Choices) == 0 {
					var u usage
					if err := json.Unmarshal(c.Usage, &u); err != nil {
						t.Fatalf("usage chunk %q: %v", ev, err)
					}
					gotUsage = &u
					continue
				}
				ch := c.Choices[0]
				if i == 0 && ch.Delta.Role != "assistant" {
					t.Errorf("first chunk role %q", ch.Delta.Role)
				}
				if ch.Delta.Content != nil {
					content.WriteString(*ch.Delta.Content)
				}
				if ch.FinishReason != nil {
					finishes = append(finishes, *ch.FinishReason)
				}
			}
			if content.String() != tt.content {
				t.Errorf("streamed content %q, want %q", content.String(), tt.content)
			}
			if len(finishes) != 1 || finishes[0] != tt.finish {
				t.Errorf("finish reasons %q, want [%q]", finishes, tt.finish)
			}
			switch {
			case tt.usage == nil && gotUsage != nil:
				t.Errorf("usage chunk %+v without include_usage", gotUsage)
			case tt.usage != nil && (gotUsage == nil || *gotUsage != *tt.usage):
				t.Errorf("usage chunk %+v, want %+v", gotUsage, tt.usage)
			}
		})
	}
}

func TestChatStreamNChoices(t *testing.T) {
	w := do(t, newEngine(), http.MethodPost, "/v1/chat/completions",
		`{"model":"echo","stream":true,"n":2,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x y"}]}`)
	text := map[int]string{}
	var u usage
	for _, ev := range events(t, w.Body.String()) {
		if ev == "[DONE]" {
			continue
		}
		var c chatChunk
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) == 0 {
			_ = json.Unmarshal(c.Usage, &u)
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != nil {
				text[ch.Index] += *ch.Delta.Content
			}
		}
	}
	if text[0] != "x y" || text[1] != "x y" || len(text) != 2 {
		t.Errorf("choices %v", text)
	}
	if u != (usage{2, 4, 6}) {
		t.Errorf("usage %+v, want {2 4 6}", u)
	}
}

// flushCounter is a ResponseWriter that counts flushes, to check that
// every event is flushed on its own.
type flushCounter struct {
	*httptest.ResponseRecorder
	flushes int
}

func (f *flushCounter) Flush() { f.flushes++; f.ResponseRecorder.Flush() }

func TestStreamFlushesEveryEvent(t *testing.T) {
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		body := `{"model":"echo","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"a b c d"}],"prompt":"a b c d"}`
		r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		w := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
		newEngine().ServeHTTP(w, r)
		n := len(events(t, w.Body.String()))
		if w.flushes != n {
			t.Errorf("%s: %d flushes for %d events", path, w.flushes, n)
		}
	}
}

// TestStreamStopsWhenClientLeaves: a slow stream whose client goes away
// ends without sending the rest.
func TestStreamStopsWhenClientLeaves(t *testing.T) {
	e := newEngine(echo.WithTokenDelay(time.Hour))
	ctx, cancel := context.WithCancel(context.Background())
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"echo","stream":true,"messages":[{"role":"user","content":"a b c"}]}`))
	w := httptest.NewRecorder()
	var returned atomic.Bool
	done := make(chan struct{})
	go func() { e.ServeHTTP(w, r); returned.Store(true); close(done) }()
	time.Sleep(10 * time.Millisecond) // the handler is in its first pause (an hour long)
	if returned.Load() {
		t.Fatal("the handler returned before the client left")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler did not return after the client left")
	}
	if strings.Contains(w.Body.String(), "[DONE]") {
		t.Errorf("a stream whose client left was finished: %s", w.Body)
	}
}
