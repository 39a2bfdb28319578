package tiktokencount_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rationhq/ration/echo"
	"github.com/rationhq/ration/gateway"
	"github.com/rationhq/ration/spender/spenderhttp"
	"github.com/rationhq/ration/spender/spenderhttp/tiktokencount"
)

// benchBody is the gateway benchmark's chat request (chatBody in
// gateway/transport_test.go, 143 bytes with model "echo") for a model the
// in-process counter knows: 145 bytes.
const benchBody = `{"model":"gpt-4o","messages":[{"role":"user","content":"measure the gateway against a bare reverse proxy on one engine, please"}],"max_tokens":8}`

// BenchmarkEstimate measures, in one run, the limit stage's estimate
// (spenderhttp.EstimateCost: parse, count, add max_tokens) of one chat
// request with
//
//	bytes4          no counter: ceil(bytes/4), the floor
//	tiktoken        this package, gpt-4o (o200k_base), encoding loaded
//	tiktoken-cl100k the same request for gpt-4 (cl100k_base)
//	engine          spenderhttp.TokenizeCounter to the echo engine's
//	                /v1/tokenize on loopback, one pooled connection
//
//	go test -run '^$' -bench BenchmarkEstimate -benchmem -count 5 ./spender/spenderhttp/tiktokencount
func BenchmarkEstimate(b *testing.B) {
	srv := httptest.NewServer(echo.New())
	b.Cleanup(srv.Close)
	tr := gateway.NewUpstreamTransport(gateway.DefaultUpstreamConns)
	b.Cleanup(tr.CloseIdleConnections)
	engine := spenderhttp.TokenizeCounter{BaseURL: srv.URL, Client: &http.Client{Transport: tr}}
	gpt4 := []byte(`{"model":"gpt-4","messages":[{"role":"user","content":"measure the gateway against a bare reverse proxy on one engine, please"}],"max_tokens":8}`)

	ctx := context.Background()
	counter := tiktokencount.New(nil)
	for _, bc := range []struct {
		name    string
		counter spenderhttp.Counter
		body    []byte
		want    int64 // tokens, to fail rather than measure a fallback
	}{
		{"bytes4", nil, []byte(benchBody), 18 + 8},
		{"tiktoken", counter, []byte(benchBody), 3 + 3 + 1 + 13 + 8},
		{"tiktoken-cl100k", counter, gpt4, 3 + 3 + 1 + 13 + 8},
		{"engine", engine, []byte(benchBody), 12 + 8},
	} {
		b.Run(bc.name, func(b *testing.B) {
			if got := spenderhttp.EstimateCost(ctx, bc.counter, bc.body); got.Tokens != bc.want {
				b.Fatalf("estimate %+v, want %d tokens", got, bc.want)
			}
			b.ReportAllocs()
			for b.Loop() {
				spenderhttp.EstimateCost(ctx, bc.counter, bc.body)
			}
		})
	}
}

// BenchmarkCountText measures CountTokens on 64 KiB of English prose
// (ASCII: the hand-written splitters), of German and Japanese prose (the
// pattern) and of letter runs at MaxRunBytes (the slowest text the bounds
// let through), per encoding, in MB/s.
//
//	go test -run '^$' -bench BenchmarkCountText -count 3 ./spender/spenderhttp/tiktokencount
func BenchmarkCountText(b *testing.B) {
	const size = 64 << 10
	prose := strings.Repeat("The quick brown fox jumps over the lazy dog; rate limits keep a shared engine fair. ", size/84)
	nonASCII := strings.Repeat("Schöne Grüße aus München: 日本語の文章も数えます。", size/66)
	runs := strings.Repeat(strings.Repeat("a", tiktokencount.MaxRunBytes)+" ", size/(tiktokencount.MaxRunBytes+1))
	ctx := context.Background()
	c := tiktokencount.New(nil)
	for _, text := range []struct{ name, s string }{{"prose", prose}, {"non-ascii", nonASCII}, {"runs", runs}} {
		for _, model := range []string{"gpt-4", "gpt-4o"} {
			b.Run(text.name+"/"+tiktokencount.EncodingForModel(model), func(b *testing.B) {
				if _, err := c.CountTokens(ctx, model, text.s); err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(len(text.s)))
				for b.Loop() {
					_, _ = c.CountTokens(ctx, model, text.s)
				}
			})
		}
	}
}
