package main

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/rationhq/ration/gateway"
	"github.com/rationhq/ration/internal/fakeclock"
)

// attempt is one HTTP attempt the SDK made.
type attempt struct {
	at         time.Time
	status     int
	retryAfter string
}

// recordAttempts is SDK middleware that notes every attempt, retries
// included.
func recordAttempts(mu *sync.Mutex, out *[]attempt) option.Middleware {
	return func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		resp, err := next(r)
		a := attempt{at: time.Now()}
		if resp != nil {
			a.status, a.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
		}
		mu.Lock()
		*out = append(*out, a)
		mu.Unlock()
		return resp, err
	}
}

func newSDK(baseURL, key string, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(baseURL + "/v1/"), option.WithAPIKey(key), option.WithRequestTimeout(20 * time.Second),
	}, opts...)...)
}

func userChat(text string, maxTokens int64) openai.ChatCompletionNewParams {
	p := openai.ChatCompletionNewParams{
		Model:    "echo",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(text)},
	}
	if maxTokens > 0 {
		p.MaxTokens = openai.Int(maxTokens)
	}
	return p
}

// TestSDKRetriesHonourRetryAfter: with a key of 1 RPM, the official SDK
// gets 429 with Retry-After, waits that long (real time), retries, and
// the call succeeds because the budget is back by then.
func TestSDKRetriesHonourRetryAfter(t *testing.T) {
	clk := &offsetClock{}
	keys := writeKeys(t, []gateway.Key{{Key: "sk-tiny", ID: "tiny", Tenant: "t", RPM: 1}})
	f := startFleet(t, testConfig(t, 1, keys), clk)
	var mu sync.Mutex
	var attempts []attempt
	client := newSDK(f.instances[0].url, "sk-tiny", option.WithMaxRetries(2), option.WithMiddleware(recordAttempts(&mu, &attempts)))

	if _, err := client.Chat.Completions.New(t.Context(), userChat("first", 4)); err != nil {
		t.Fatal(err)
	}
	// Let the limiter's background refresh (started when the first request
	// spent the lease) finish before time jumps, so its answer is not
	// applied across the jump. Then 59 s of the minute pass at once: the
	// next request is due in about 1 s.
	if err := f.instances[0].limiter.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	clk.Advance(59 * time.Second)
	start := time.Now()
	resp, err := client.Chat.Completions.New(t.Context(), userChat("second call", 4))
	if err != nil {
		t.Fatalf("the SDK gave up: %v (attempts %+v)", err, attempts)
	}
	if got := resp.Choices[0].Message.Content; got != "second call" {
		t.Errorf("content %q", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(attempts) != 3 || attempts[1].status != 429 || attempts[2].status != 200 {
		t.Fatalf("attempts %+v, want 200, then 429 and 200", attempts)
	}
	if attempts[1].retryAfter != "1" {
		t.Errorf("Retry-After %q, want 1", attempts[1].retryAfter)
	}
	if waited := attempts[2].at.Sub(attempts[1].at); waited < time.Second || time.Since(start) > 10*time.Second {
		t.Errorf("the SDK waited %v between the 429 and the retry; Retry-After said 1s", waited)
	}
}

// TestSDKTooLargeFailsClearly: a request that can never fit is a 429
// without Retry-After whose message says so.
func TestSDKTooLargeFailsClearly(t *testing.T) {
	keys := writeKeys(t, []gateway.Key{{Key: "sk-tpm", ID: "tpm", Tenant: "t", TPM: 50}})
	f := startFleet(t, testConfig(t, 1, keys), fakeclock.New())
	client := newSDK(f.instances[0].url, "sk-tpm", option.WithMaxRetries(0))
	_, err := client.Chat.Completions.New(t.Context(), userChat("hi", 100))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || !strings.Contains(apiErr.Message, "can never be admitted") {
		t.Fatalf("error %v, want 429 'can never be admitted'", err)
	}
	if ra := apiErr.Response.Header.Get("Retry-After"); ra != "" {
		t.Errorf("Retry-After %q on a request that can never fit", ra)
	}
}

// TestSDKStreamSettlesActualUsage: a streamed completion through the SDK
// (which does not ask for usage) is charged its actual usage, as the next
// response's x-ratelimit-remaining-tokens shows. Frozen clock: no refill.
func TestSDKStreamSettlesActualUsage(t *testing.T) {
	keys := writeKeys(t, []gateway.Key{{Key: "sk-tok", ID: "tok", Tenant: "t", TPM: 1000}})
	f := startFleet(t, testConfig(t, 1, keys), fakeclock.New())
	client := newSDK(f.instances[0].url, "sk-tok", option.WithMaxRetries(0))

	// Reserved 4 prompt + 10 max = 14; the echo uses 4 + 4 = 8.
	stream := client.Chat.Completions.NewStreaming(t.Context(), userChat("one two three four", 10))
	var content strings.Builder
	chunks := 0
	for stream.Next() {
		chunks++
		for _, c := range stream.Current().Choices {
			content.WriteString(c.Delta.Content)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	stream.Close()
	if content.String() != "one two three four" || chunks != 6 { // role, 4 words, finish; no usage chunk
		t.Errorf("streamed %q in %d chunks", content.String(), chunks)
	}

	// Reserves 1 + 1 = 2: remaining 1000 - 8 - 2.
	var httpResp *http.Response
	resp, err := client.Chat.Completions.New(t.Context(), userChat("x", 1), option.WithResponseInto(&httpResp))
	if err != nil {
		t.Fatal(err)
	}
	if got := httpResp.Header.Get("X-Ratelimit-Remaining-Tokens"); got != "990" {
		t.Errorf("x-ratelimit-remaining-tokens %s after the stream, want 990 (1000 - 8 settled - 2 reserved)", got)
	}
	if resp.Usage.PromptTokens != 1 || resp.Usage.CompletionTokens != 1 || resp.Usage.TotalTokens != 2 {
		t.Errorf("usage %+v", resp.Usage)
	}
}
