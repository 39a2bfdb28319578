package gateway_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/gateway"
	"github.com/rationhq/ration/internal/testkit"
	"github.com/rationhq/ration/spender/spenderhttp"
	"github.com/rationhq/ration/spender/spenderhttp/tiktokencount"
)

// BenchmarkUpstream measures, in one run and on one echo engine over
// loopback, 32 concurrent clients sending a 140-byte chat request to
//
//	engine      the echo engine directly
//	bare-proxy  a bare httputil.ReverseProxy with a pooled transport
//	bare-proxy-buffers  the same reusing its copy buffers as the
//	            gateway's proxy does
//	gateway     one gateway instance (auth, the limit stage on a
//	            standalone Limiter, the engine's /v1/tokenize, the proxy),
//	            its connections to the engine pooled
//	gateway-default-transport  the same on http.DefaultTransport (2 idle
//	            connections per host), what an unpooled gateway pays
//	gateway-engine-gpt-4o    the gateway, the same request for model
//	            gpt-4o (145 bytes), counted by the engine's /v1/tokenize:
//	            gateway-demo -tokenizer engine
//	gateway-tiktoken-gpt-4o  the same, counted in-process by
//	            tiktokencount (o200k_base), no tokenize call:
//	            gateway-demo -tokenizer tiktoken
//	gateway-tiktoken-gpt-4o-access-log  the same with the access log
//	            on (gateway-demo's default), its text lines written to
//	            a file
//
// and reports requests/s and the process's CPU time per request of each. The targets are at least
// 0.8x the bare proxy's requests/s counting in-process and 0.6x with engine tokenization
// (docs/performance.md). -count repeats each row before the next, so
// compare rows within rounds of whole runs:
//
//	go test -c -o /tmp/gw.test ./gateway
//	for i in 1 2 3; do /tmp/gw.test -test.run '^$' -test.bench BenchmarkUpstream -test.benchtime 2s; done
func BenchmarkUpstream(b *testing.B) {
	const clients = 32
	engine, _ := countedEngine(b)
	up, err := gateway.ParseUpstream(engine)
	if err != nil {
		b.Fatal(err)
	}
	tr := gateway.NewUpstreamTransport(gateway.DefaultUpstreamConns)
	b.Cleanup(tr.CloseIdleConnections)
	bare := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(up) },
		Transport: tr,
	})
	b.Cleanup(bare.Close)
	bareBuffers := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:    func(pr *httputil.ProxyRequest) { pr.SetURL(up) },
		Transport:  tr,
		BufferPool: gateway.NewCopyBuffers(),
	})
	b.Cleanup(bareBuffers.Close)
	gw := pooledGateway(b, engine, gateway.DefaultUpstreamConns)
	old, err := gateway.New(testKeys(b), testkit.Limiter(b, ration.SystemClock{}), up,
		gateway.WithTransport(http.DefaultTransport), gateway.WithCounter(spenderhttp.TokenizeCounter{BaseURL: engine}))
	if err != nil {
		b.Fatal(err)
	}
	oldSrv := httptest.NewServer(old)
	b.Cleanup(oldSrv.Close)
	gwTiktoken := pooledGatewayCounting(b, engine, gateway.DefaultUpstreamConns, func(*http.Client) spenderhttp.Counter {
		return tiktokencount.New(nil)
	})
	logFile, err := os.Create(filepath.Join(b.TempDir(), "access.log"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { logFile.Close() })
	gwLogged := pooledGatewayCounting(b, engine, gateway.DefaultUpstreamConns, func(*http.Client) spenderhttp.Counter {
		return tiktokencount.New(nil)
	}, gateway.WithAccessLog(true), gateway.WithLogger(slog.New(slog.NewTextHandler(logFile, nil))))
	gpt4o := strings.Replace(chatBody, `"model":"echo"`, `"model":"gpt-4o"`, 1)

	for _, target := range []struct{ name, url, body string }{
		{"engine", engine, chatBody}, {"bare-proxy", bare.URL, chatBody}, {"bare-proxy-buffers", bareBuffers.URL, chatBody},
		{"gateway", gw, chatBody},
		{"gateway-default-transport", oldSrv.URL, chatBody},
		{"gateway-engine-gpt-4o", gw, gpt4o}, {"gateway-tiktoken-gpt-4o", gwTiktoken, gpt4o},
		{"gateway-tiktoken-gpt-4o-access-log", gwLogged, gpt4o},
	} {
		b.Run(target.name, func(b *testing.B) {
			client := &http.Client{Transport: gateway.NewUpstreamTransport(clients)}
			defer client.CloseIdleConnections()
			b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			cpu0 := testkit.CPUTime()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if status := postChat(client, target.url, target.body); status != http.StatusOK {
						b.Errorf("%s: status %d", target.name, status)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			// CPU time of this process (clients, gateway and engine) per
			// request: unlike req/s, it does not move when other
			// processes share the cores.
			b.ReportMetric(float64((testkit.CPUTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/req")
		})
	}
}
