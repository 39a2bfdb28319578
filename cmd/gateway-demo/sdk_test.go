package main

import (
	"errors"
	"io"
	"net/http"
	"strconv"
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

// TestSDKRetriesHonourRetryAfter: once a key's 60 RPM are spent, the
// official SDK gets 429 with Retry-After (1 s: one request refills per
// second), waits that long in real time, retries, and the call succeeds
// because the budget is back by then. The limiter's clock is frozen and
// moved on by the Retry-After the client was given, so the first attempt
// meets a spent budget however slowly the machine runs.
func TestSDKRetriesHonourRetryAfter(t *testing.T) {
	keys := writeKeys(t, []gateway.Key{{Key: "sk-tiny", ID: "tiny", Tenant: "t", RPM: 60}})
	clk := fakeclock.New()
	f := startFleet(t, testConfig(t, 1, keys), clk)
	url := f.instances[0].url
	var mu sync.Mutex
	var attempts []attempt
	client := newSDK(url, "sk-tiny", option.WithMaxRetries(2), option.WithMiddleware(recordAttempts(&mu, &attempts)),
		option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			resp, err := next(r)
			if resp != nil && resp.StatusCode == http.StatusTooManyRequests {
				if ra, perr := strconv.Atoi(resp.Header.Get("Retry-After")); perr == nil {
					clk.Advance(time.Duration(ra) * time.Second) // the time the client is told to wait
				}
			}
			return resp, err
		}))

	// Spend the minute's budget without the SDK (it would retry).
	spent := 0
	for range 200 {
		if status, _ := rawChat(t, url, "sk-tiny", "spend"); status == http.StatusTooManyRequests {
			break
		}
		spent++
	}
	if spent != 60 {
		t.Fatalf("admitted %d before the first 429, want the key's 60 (the clock is frozen)", spent)
	}
	start := time.Now()
	resp, err := client.Chat.Completions.New(t.Context(), userChat("after the wait", 4))
	if err != nil {
		t.Fatalf("the SDK gave up: %v (attempts %+v)", err, attempts)
	}
	if got := resp.Choices[0].Message.Content; got != "after the wait" {
		t.Errorf("content %q", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(attempts) < 2 || attempts[0].status != 429 || attempts[len(attempts)-1].status != 200 {
		t.Fatalf("attempts %+v, want 429 then 200", attempts)
	}
	ra, err := strconv.Atoi(attempts[0].retryAfter)
	if err != nil || ra != 1 {
		t.Fatalf("Retry-After %q, want 1 second", attempts[0].retryAfter)
	}
	if waited := attempts[1].at.Sub(attempts[0].at); waited < time.Duration(ra)*time.Second {
		t.Errorf("the SDK retried %v after the 429; Retry-After said %ds", waited, ra)
	}
	if len(attempts) != 2 {
		t.Errorf("attempts %+v: the first retry after Retry-After should succeed", attempts)
	}
	t.Logf("spent %d, then 429 with Retry-After %d; SDK retried after %v; total %v",
		spent, ra, attempts[1].at.Sub(attempts[0].at).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// rawChat posts a one-word chat request and returns the status and body.
func rawChat(t *testing.T, baseURL, key, text string) (int, string) {
	t.Helper()
	resp, body := postChat(t, baseURL, key, text)
	return resp.StatusCode, body
}

// postChat posts a one-word chat request and returns the response, its
// body read and closed, and the body.
func postChat(t *testing.T, baseURL, key, text string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, baseURL+"/v1/chat/completions",
		strings.NewReader(`{"model":"echo","max_tokens":1,"messages":[{"role":"user","content":"`+text+`"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
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
