package spenderhttp_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// discardWriter is a ResponseWriter that keeps nothing, so the benchmark
// measures the stage and not httptest.ResponseRecorder. It keeps the
// status, so that the benchmark fails rather than measure an error path.
type discardWriter struct {
	h      http.Header
	status int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(status int)      { d.status = status }

// BenchmarkMiddleware measures what the stage adds to a request that a
// handler answers 200 with a small JSON body carrying usage: reading and
// parsing the body, the estimate (bytes/4, no tokenizer), Reserve on the
// standalone Limiter, the headers, usage capture and Settle. "bare" is the
// same handler without the stage; the difference is the overhead.
func BenchmarkMiddleware(b *testing.B) {
	body := []byte(`{"model":"llama-3-8b","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write a haiku about rate limits."}],"max_tokens":64,"temperature":0.7}`)
	answer := []byte(`{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Tokens drip like rain"},"finish_reason":"stop"}],"usage":{"prompt_tokens":30,"completion_tokens":6,"total_tokens":36}}`)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header()["Content-Type"] = []string{"application/json"}
		w.WriteHeader(200)
		_, _ = w.Write(answer)
	})
	p := spenderhttp.Principal{KeyID: "key_bench", Limits: ration.Limits{RPM: ration.MaxRate, TPM: ration.MaxRate}}
	run := func(b *testing.B, h http.Handler) {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		req = req.WithContext(spenderhttp.WithPrincipal(req.Context(), p))
		w := &discardWriter{h: make(http.Header, 16)}
		rd := bytes.NewReader(body)
		rc := io.NopCloser(rd)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			rd.Reset(body)
			req.Body, req.ContentLength = rc, int64(len(body))
			clear(w.h)
			h.ServeHTTP(w, req)
			if w.status != http.StatusOK {
				b.Fatalf("status %d, want 200", w.status)
			}
		}
	}
	b.Run("bare", func(b *testing.B) { run(b, handler) })
	b.Run("middleware", func(b *testing.B) {
		run(b, spenderhttp.Middleware(newLimiter(b, ration.SystemClock{}), nil)(handler))
	})
}
