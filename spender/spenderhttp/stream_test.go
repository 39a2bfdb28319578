package spenderhttp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// contentChunk is an OpenAI chat stream chunk carrying text; withNullUsage
// adds "usage":null as OpenAI does on every chunk once include_usage is on.
func contentChunk(text string, withNullUsage bool) string {
	u := ""
	if withNullUsage {
		u = `,"usage":null`
	}
	return fmt.Sprintf(`{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":%q}}]%s}`, text, u)
}

const usageChunk = `{"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}`

// engine is a fake OpenAI-compatible upstream that streams events and
// records the body it was sent. When step is non-nil it waits for a value
// on it before each event after the first. After the events it waits for
// the request to end when holdOpen is set.
type engine struct {
	events   []string
	step     chan struct{}
	holdOpen bool
	bodies   chan []byte
}

func (e *engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	e.bodies <- b
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Ratelimit-Remaining-Tokens", "999999") // the engine's own; must not reach the client
	w.WriteHeader(200)
	rc := http.NewResponseController(w)
	for i, ev := range e.events {
		if e.step != nil && i > 0 {
			select {
			case <-e.step:
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprintf(w, "data: %s\n\n", ev)
		_ = rc.Flush()
	}
	if e.holdOpen {
		<-r.Context().Done()
	}
}

// gateway runs the chain authentication → Middleware → ReverseProxy to
// the engine on loopback servers, and returns its URL.
type gateway struct {
	engine, front *httptest.Server
	rec           *recordingReserver
	settled       chan event
}

func newGateway(t *testing.T, e *engine, p spenderhttp.Principal) *gateway {
	t.Helper()
	g := &gateway{settled: make(chan event, 16)}
	g.engine = httptest.NewServer(e)
	u, _ := url.Parse(g.engine.URL)
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.ErrorLog = nil
	g.rec, _ = newRecorder(t)
	g.rec.notify = g.settled
	g.front = httptest.NewServer(authed(p, spenderhttp.Middleware(g.rec, nil)(proxy)))
	return g
}

func (g *gateway) Close() {
	g.front.Close()
	g.engine.Close()
}

// waitSettled returns how the one reservation ended.
func (g *gateway) waitSettled(t *testing.T) event {
	t.Helper()
	select {
	case ev := <-g.settled:
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("the reservation was never settled or cancelled")
		return event{}
	}
}

// readEvents reads SSE data payloads until EOF.
func readEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, v)
		}
	}
	return out
}

func post(t *testing.T, ctx context.Context, url, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

var streamKey = spenderhttp.Principal{KeyID: "k", Limits: ration.Limits{RPM: 10, TPM: 10000}}

func TestStreamUsageFromFinalChunkSettles(t *testing.T) {
	e := &engine{
		events: []string{contentChunk("Hel", true), contentChunk("lo", true), contentChunk("!", true), usageChunk, "[DONE]"},
		bodies: make(chan []byte, 1),
	}
	g := newGateway(t, e, streamKey)
	defer g.Close()

	resp := post(t, context.Background(), g.front.URL, chat(`"stream":true`))
	got := readEvents(t, resp.Body)
	resp.Body.Close()

	// The engine was asked for usage although the client did not ask.
	var sent struct {
		Stream        bool `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		Messages []json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(<-e.bodies, &sent); err != nil || !sent.Stream || !sent.StreamOptions.IncludeUsage || len(sent.Messages) != 1 {
		t.Errorf("engine got %+v (%v), want the client's body plus stream_options.include_usage", sent, err)
	}
	if ev := g.waitSettled(t); ev != (event{"settle", ration.Amount{Requests: 1, Tokens: 13}}) {
		t.Errorf("reservation ended %+v, want settle of the final chunk's 13 tokens", ev)
	}
	if want := []string{contentChunk("Hel", true), contentChunk("lo", true), contentChunk("!", true), "[DONE]"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("client read %q, want %q", got, want)
	}
	if v := resp.Header.Get("X-Ratelimit-Remaining-Tokens"); v != "9734" {
		t.Errorf("remaining-tokens %q, want ours (10000 - 10 - 256), not the engine's", v)
	}
	if v := resp.Header.Values("X-Ratelimit-Remaining-Tokens"); len(v) != 1 {
		t.Errorf("remaining-tokens sent %d times: %q", len(v), v)
	}
}

func TestStreamInjectedUsageChunkNotForwarded(t *testing.T) {
	tests := []struct {
		name          string
		body          string
		wantUsage     bool   // the client sees the usage chunk
		wantForwarded string // a substring of the body the engine gets
	}{
		{"client did not ask", chat(`"stream":true`), false, `"include_usage":true`},
		{"client asked", chat(`"stream":true,"stream_options":{"include_usage":true}`), true, `"stream_options":{"include_usage":true}`},
		{"client said no", chat(`"stream":true,"stream_options":{"include_usage":false,"x":1}`), false, `"stream_options":{"include_usage":true,"x":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &engine{events: []string{contentChunk("a", true), usageChunk, "[DONE]"}, bodies: make(chan []byte, 1)}
			g := newGateway(t, e, streamKey)
			defer g.Close()
			resp := post(t, context.Background(), g.front.URL, tt.body)
			got := readEvents(t, resp.Body)
			resp.Body.Close()
			if body := string(<-e.bodies); !strings.Contains(body, tt.wantForwarded) {
				t.Errorf("engine got %s, want it to contain %s", body, tt.wantForwarded)
			}
			sawUsage := false
			for _, ev := range got {
				if strings.Contains(ev, `"total_tokens"`) {
					sawUsage = true
				}
			}
			if sawUsage != tt.wantUsage {
				t.Errorf("client saw the usage chunk: %v, want %v (events %q)", sawUsage, tt.wantUsage, got)
			}
			if len(got) == 0 || got[len(got)-1] != "[DONE]" {
				t.Errorf("stream does not end in [DONE]: %q", got)
			}
			if ev := g.waitSettled(t); ev.cost.Tokens != 13 {
				t.Errorf("settled %+v, want 13 tokens", ev)
			}
		})
	}
}

func TestStreamFlushesPerEvent(t *testing.T) {
	e := &engine{
		events: []string{contentChunk("one", false), contentChunk("two", false), "[DONE]"},
		step:   make(chan struct{}),
		bodies: make(chan []byte, 1),
	}
	g := newGateway(t, e, streamKey)
	defer g.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp := post(t, ctx, g.front.URL, chat(`"stream":true,"stream_options":{"include_usage":true}`))
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	// Each event must reach the client before the engine sends the next:
	// a buffering middleware would leave this read waiting until the
	// deadline.
	for i, want := range e.events {
		if i > 0 {
			e.step <- struct{}{}
		}
		var line string
		for line == "" && sc.Scan() {
			line = sc.Text()
		}
		if line != "data: "+want {
			t.Fatalf("event %d: read %q (%v), want it before the engine sends more", i, line, sc.Err())
		}
	}
	// No usage came: settled with the prompt estimate (10) plus the
	// streamed text, 6 bytes = 2 tokens.
	if ev := g.waitSettled(t); ev != (event{"settle", ration.Amount{Requests: 1, Tokens: 12}}) {
		t.Errorf("settled %+v, want 12 tokens", ev)
	}
}

func TestStreamClientDisconnectSettles(t *testing.T) {
	defer goleak.VerifyNone(t)
	e := &engine{
		events:   []string{contentChunk("abcdefgh", true), contentChunk("ijklmnop", true)},
		holdOpen: true,
		bodies:   make(chan []byte, 1),
	}
	g := newGateway(t, e, streamKey)
	ctx, cancel := context.WithCancel(context.Background())
	resp := post(t, ctx, g.front.URL, chat(`"stream":true`))
	sc := bufio.NewScanner(resp.Body)
	for n := 0; n < 2 && sc.Scan(); {
		if strings.HasPrefix(sc.Text(), "data: ") {
			n++
		}
	}
	cancel() // the client walks away mid-stream
	resp.Body.Close()

	// Prompt estimate 10 plus 16 bytes of streamed text = 4 tokens; not
	// the 266 reserved and not a cancel.
	if ev := g.waitSettled(t); ev != (event{"settle", ration.Amount{Requests: 1, Tokens: 14}}) {
		t.Errorf("reservation ended %+v, want settle of 14 tokens", ev)
	}
	g.Close()
	http.DefaultClient.CloseIdleConnections()
}

func TestStreamFlushedWithoutHandlerFlush(t *testing.T) {
	step := make(chan struct{})
	events := []string{contentChunk("one", false), contentChunk("two", false), "[DONE]"}
	// A handler that never flushes: the middleware must send each event
	// as it completes, or the client waits for the whole answer.
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i, ev := range events {
			if i > 0 {
				select {
				case <-step:
				case <-r.Context().Done():
					return
				}
			}
			fmt.Fprintf(w, "data: %s\n\n", ev)
		}
	})
	rec, _ := newRecorder(t)
	front := httptest.NewServer(authed(streamKey, spenderhttp.Middleware(rec, nil)(handler)))
	defer front.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp := post(t, ctx, front.URL, chat(`"stream":true`))
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for i, want := range events {
		if i > 0 {
			step <- struct{}{}
		}
		var line string
		for line == "" && sc.Scan() {
			line = sc.Text()
		}
		if line != "data: "+want {
			t.Fatalf("event %d: read %q (%v), want it before the handler writes more", i, line, sc.Err())
		}
	}
}

// TestStreamSettledBeforeDone: a stream that reported usage is settled
// before its "[DONE]" reaches the client, so the client's next request
// sees it in its headers; the handler's return does not settle it again.
func TestStreamSettledBeforeDone(t *testing.T) {
	e := &engine{
		events:   []string{contentChunk("Hi", true), usageChunk, "[DONE]"},
		holdOpen: true, // the handler returns only when the client leaves
		bodies:   make(chan []byte, 1),
	}
	g := newGateway(t, e, streamKey)
	ctx, cancel := context.WithCancel(context.Background())
	resp := post(t, ctx, g.front.URL, chat(`"stream":true`))
	<-e.bodies
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && sc.Text() != "data: [DONE]" {
	}
	select {
	case ev := <-g.settled:
		if ev != (event{"settle", ration.Amount{Requests: 1, Tokens: 13}}) {
			t.Errorf("reservation ended %+v, want settle of 13 tokens", ev)
		}
	default:
		t.Fatal("the client read [DONE] before the reservation was settled")
	}
	cancel()
	resp.Body.Close()
	g.Close() // waits for the handler to return
	if evs := g.rec.Events(); len(evs) != 1 {
		t.Errorf("reservation ended %d times: %+v", len(evs), evs)
	}
}
