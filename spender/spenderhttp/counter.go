package spenderhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Counter counts prompt tokens with the model's own tokenizer.
//
// CountTokens returns how many tokens text encodes to under model's
// tokenizer. EstimateCost falls back to ceil(bytes/4) when it returns an
// error or a count below 1 for non-empty text, so a Counter may fail
// freely; it should honour ctx.
type Counter interface {
	CountTokens(ctx context.Context, model, text string) (int64, error)
}

// ChatMessage is one chat/completions message as a MessageCounter sees it.
type ChatMessage struct {
	// Role is the message's role ("system", "user", ...); "" when absent
	// or not a string.
	Role string
	// Name is the optional participant name; "" when absent.
	Name string
	// Content is the message's text: a string content, or the text parts
	// of an array content joined by newlines, as PromptText joins them.
	// Images, audio and tool calls are left out.
	Content string
}

// MessageCounter is a Counter that can also count a chat request's
// messages as the model's chat format encodes them: each message's role,
// name and content plus the tokens the format adds around them, which a
// count of the joined text (PromptText) leaves out.
//
// For a body with chat messages, EstimateCost asks CountMessages first.
// When it fails or returns less than 1, the joined text is counted with
// CountTokens as for any Counter. So a MessageCounter may refuse what it
// does not know (a model, a size) and still be asked for the text.
// Prompt or input text in the same body is counted with CountTokens and
// added.
type MessageCounter interface {
	Counter
	CountMessages(ctx context.Context, model string, msgs []ChatMessage) (int64, error)
}

// CounterFunc adapts a function to Counter.
type CounterFunc func(ctx context.Context, model, text string) (int64, error)

// CountTokens calls f.
func (f CounterFunc) CountTokens(ctx context.Context, model, text string) (int64, error) {
	return f(ctx, model, text)
}

// DefaultTokenizeTimeout bounds one TokenizeCounter call when its Timeout
// is 0.
const DefaultTokenizeTimeout = 2 * time.Second

// maxTokenizeResponse caps how much of a /v1/tokenize answer is read, in
// bytes: enough for the ids of a 16 MiB prompt.
const maxTokenizeResponse = 64 << 20

// ErrTokenize is wrapped by every error a TokenizeCounter returns.
var ErrTokenize = errors.New("spenderhttp: tokenize failed")

// TokenizeCounter is the production Counter: it asks the inference
// engine's tokenizer over HTTP.
//
// It POSTs {"model": model, "text": text} as JSON to
// BaseURL + "/v1/tokenize" and accepts a 2xx JSON answer of any of these
// shapes:
//
//	{"tokens": [101, 2023, ...]}              the ids; the count is their number
//	{"count": 5, "tokens": [...], ...}        vLLM: count wins over the array
//	{"count": 5}                              a count alone
//	[101, 2023, ...]                          a bare array of ids
//
// Any other status or shape is an error wrapping ErrTokenize, and the
// estimate falls back to bytes/4. The zero value is unusable (no BaseURL);
// a TokenizeCounter is safe for concurrent use.
type TokenizeCounter struct {
	// BaseURL is the engine's root, e.g. "http://127.0.0.1:8000"; a
	// trailing slash is ignored.
	BaseURL string
	// Client sends the request; nil means http.DefaultClient.
	Client *http.Client
	// Timeout bounds each call, on top of ctx; 0 means
	// DefaultTokenizeTimeout and a negative value means no bound but ctx.
	Timeout time.Duration
}

var _ Counter = TokenizeCounter{}

// CountTokens implements Counter.
func (c TokenizeCounter) CountTokens(ctx context.Context, model, text string) (int64, error) {
	if c.BaseURL == "" {
		return 0, fmt.Errorf("%w: no BaseURL", ErrTokenize)
	}
	timeout := c.Timeout
	if timeout == 0 {
		timeout = DefaultTokenizeTimeout
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	payload, err := json.Marshal(struct {
		Model string `json:"model"`
		Text  string `json:"text"`
	}{model, text})
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrTokenize, err)
	}
	url := strings.TrimSuffix(c.BaseURL, "/") + "/v1/tokenize"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrTokenize, err)
	}
	req.Header.Set("Content-Type", "application/json")
	client := c.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrTokenize, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenizeResponse))
	if err != nil {
		return 0, fmt.Errorf("%w: reading the answer: %w", ErrTokenize, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return 0, fmt.Errorf("%w: %s answered %s", ErrTokenize, url, resp.Status)
	}
	n, err := parseTokenizeAnswer(body)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrTokenize, err)
	}
	return n, nil
}

// parseTokenizeAnswer counts the ids in a /v1/tokenize answer of one of
// the shapes TokenizeCounter documents.
func parseTokenizeAnswer(body []byte) (int64, error) {
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '[' {
		return countArray(body)
	}
	var a struct {
		Count  *int64          `json:"count"`
		Tokens json.RawMessage `json:"tokens"`
	}
	if err := json.Unmarshal(body, &a); err != nil {
		return 0, fmt.Errorf("answer is not JSON: %w", err)
	}
	switch {
	case a.Count != nil && *a.Count >= 0:
		return *a.Count, nil
	case len(a.Tokens) > 0 && a.Tokens[0] == '[':
		return countArray(a.Tokens)
	}
	return 0, errors.New(`answer has neither "count" nor a "tokens" array`)
}

// countArray returns the number of elements of the JSON array raw without
// decoding them: it counts the commas at depth 1 outside strings.
func countArray(raw []byte) (int64, error) {
	if !json.Valid(raw) {
		return 0, errors.New("invalid JSON array")
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) < 2 || raw[0] != '[' {
		return 0, errors.New("not a JSON array")
	}
	var n int64
	var sc stringSkipper
	depth, empty := 0, true
	for _, b := range raw {
		if sc.inString(b) {
			if depth == 1 {
				empty = false
			}
			continue
		}
		switch b {
		case '[', '{':
			if depth == 1 {
				empty = false
			}
			depth++
		case ']', '}':
			depth--
		case ',':
			if depth == 1 {
				n++
			}
		case ' ', '\t', '\n', '\r':
		default:
			if depth == 1 {
				empty = false
			}
		}
	}
	if empty {
		return 0, nil
	}
	return n + 1, nil
}
