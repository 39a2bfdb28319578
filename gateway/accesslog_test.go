package gateway_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/gateway"
	"github.com/rationhq/ration/internal/testkit"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// TestAccessLog: with WithAccessLog, one INFO line per /v1/ request, in
// order: the key's id and never its secret, the status and body bytes,
// admitted or the budget that refused it; no limit verdict for a request
// the limit stage did not reserve for (GET) and no key for one without a
// valid key; a path as long as the client likes is cut. Without the
// option, no request is logged.
func TestAccessLog(t *testing.T) {
	var logs testkit.SyncBuffer
	r := newRig(t, nil, gateway.WithAccessLog(true), gateway.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	url := r.url + "/v1/chat/completions"
	post(t, url, "sk-small", chat("hello big world", `,"max_tokens":2`))
	post(t, url, "sk-small", chat("a b", `,"max_tokens":2`))
	post(t, url, "sk-small", chat("x", "")) // RPM 2 spent: 429
	post(t, url, "sk-nobody", chat("x", ""))
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, r.url+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer sk-free")
	_, models := send(t, req)
	req, _ = http.NewRequestWithContext(t.Context(), http.MethodGet, r.url+"/v1/"+strings.Repeat("a", 5000), nil)
	send(t, req)

	var lines []string
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, `msg="gateway: request"`) {
			lines = append(lines, l[strings.Index(l, "method="):len(l)-1])
		}
	}
	want := []string{
		`method=POST path=/v1/chat/completions key=small status=200 bytes=`, `limit=admitted`,
		`method=POST path=/v1/chat/completions key=small status=200 bytes=`, `limit=admitted`,
		`method=POST path=/v1/chat/completions key=small status=429 bytes=`, `limit=refused budget=small dimension=requests`,
		`method=POST path=/v1/chat/completions status=401 bytes=`, ``,
		`method=GET path=/v1/models key=free status=200 bytes=` + strconv.Itoa(len(models)) + ` duration=`, ``,
		`method=GET path=/v1/` + strings.Repeat("a", 252) + `... status=401 bytes=`, ``,
	}
	if len(lines) != len(want)/2 {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want)/2, logs.String())
	}
	for i, l := range lines {
		if !strings.HasPrefix(l, want[2*i]) || !strings.HasSuffix(l, want[2*i+1]) || strings.Contains(l, "sk-") ||
			(want[2*i+1] == "" && strings.Contains(l, "limit=")) {
			t.Errorf("line %d:\n got %s\nwant %s...%s", i, l, want[2*i], want[2*i+1])
		}
	}

	var quietLogs testkit.SyncBuffer
	quiet := newRig(t, nil, gateway.WithLogger(slog.New(slog.NewTextHandler(&quietLogs, nil))))
	post(t, quiet.url+"/v1/chat/completions", "sk-small", chat("hello", ""))
	if strings.Contains(quietLogs.String(), "gateway: request") {
		t.Fatalf("logged without WithAccessLog:\n%s", quietLogs.String())
	}
}

// BenchmarkAccessLog measures what the access log costs a gateway
// instance: 32 concurrent clients sending a chat request through one
// gateway on the echo engine over loopback, without the access log and
// with it (a text line per request, written to io.Discard), in one run.
// The CPU time per request is the process's (clients, gateway, engine):
//
//	go test -run '^$' -bench BenchmarkAccessLog -benchtime 3s -count 5 ./gateway
func BenchmarkAccessLog(b *testing.B) {
	const clients = 32
	engine, _ := countedEngine(b)
	up, err := gateway.ParseUpstream(engine)
	if err != nil {
		b.Fatal(err)
	}
	for _, on := range []bool{false, true} {
		tr := gateway.NewUpstreamTransport(gateway.DefaultUpstreamConns)
		b.Cleanup(tr.CloseIdleConnections)
		g, err := gateway.New(testKeys(b), testkit.Limiter(b, ration.SystemClock{}), up, gateway.WithTransport(tr),
			gateway.WithCounter(spenderhttp.TokenizeCounter{BaseURL: engine, Client: &http.Client{Transport: tr}}),
			gateway.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), gateway.WithAccessLog(on))
		if err != nil {
			b.Fatal(err)
		}
		srv := httptest.NewServer(g)
		b.Cleanup(srv.Close)
		b.Run(map[bool]string{false: "off", true: "on"}[on], func(b *testing.B) {
			client := &http.Client{Transport: gateway.NewUpstreamTransport(clients)}
			defer client.CloseIdleConnections()
			b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			cpu0 := testkit.CPUTime()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if status := postChat(client, srv.URL, chatBody); status != http.StatusOK {
						b.Errorf("status %d", status)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			b.ReportMetric(float64((testkit.CPUTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/req")
		})
	}
}
