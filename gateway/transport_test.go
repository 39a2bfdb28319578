package gateway_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/echo"
	"github.com/rationhq/ration/gateway"
	"github.com/rationhq/ration/internal/testkit"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// chatBody is a 140-byte chat request, the size the proxy benchmarks use.
var chatBody = chat("measure the gateway against a bare reverse proxy on one engine, please", `,"max_tokens":8`)

// countedEngine serves the echo engine on a loopback port and counts the
// connections it accepts.
func countedEngine(t testing.TB) (url string, accepted *atomic.Int64) {
	t.Helper()
	accepted = new(atomic.Int64)
	srv := httptest.NewUnstartedServer(echo.New())
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			accepted.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL, accepted
}

// pooledGateway is a gateway (standalone limiter, system clock) in front
// of engineURL, its proxy and tokenize call on one pooled transport.
func pooledGateway(t testing.TB, engineURL string, conns int) string {
	return pooledGatewayCounting(t, engineURL, conns, func(c *http.Client) spenderhttp.Counter {
		return spenderhttp.TokenizeCounter{BaseURL: engineURL, Client: c}
	})
}

// pooledGatewayCounting is pooledGateway with the prompt counter
// counter(the client on the pooled transport) returns, and opts.
func pooledGatewayCounting(t testing.TB, engineURL string, conns int, counter func(*http.Client) spenderhttp.Counter, opts ...gateway.Option) string {
	t.Helper()
	up, err := gateway.ParseUpstream(engineURL)
	if err != nil {
		t.Fatal(err)
	}
	tr := gateway.NewUpstreamTransport(conns)
	t.Cleanup(tr.CloseIdleConnections)
	opts = append([]gateway.Option{gateway.WithTransport(tr), gateway.WithCounter(counter(&http.Client{Transport: tr}))}, opts...)
	g, err := gateway.New(testKeys(t), testkit.Limiter(t, ration.SystemClock{}), up, opts...)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	return srv.URL
}

// hammer sends n chat requests with key sk-free from workers goroutines,
// over a client that keeps its connections, and fails on any non-200.
func hammer(t testing.TB, url string, workers, n int) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: gateway.NewUpstreamTransport(workers)}
	defer client.CloseIdleConnections()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if status := chatOnce(client, url); status != http.StatusOK {
					t.Errorf("status %d", status)
					return
				}
			}
		})
	}
	wg.Wait()
}

func chatOnce(client *http.Client, url string) int { return postChat(client, url, chatBody) }

// postChat posts body to url's chat completions with key sk-free and
// returns the status, -1 on a transport error.
func postChat(client *http.Client, url, body string) int {
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer sk-free")
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return -1
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestUpstreamConnectionsAreReused: the gateway keeps
// its connections to the engine (the proxy's and the tokenize call's) for
// reuse instead of opening one per request, which left thousands of
// sockets in TIME_WAIT. Sequential requests reuse one or two connections;
// concurrent ones at most about two per client (a tokenize call and a
// proxied one may overlap across requests).
func TestUpstreamConnectionsAreReused(t *testing.T) {
	engine, accepted := countedEngine(t)
	gw := pooledGateway(t, engine, gateway.DefaultUpstreamConns)

	hammer(t, gw, 1, 100)
	if n := accepted.Load(); n > 2 {
		t.Errorf("100 sequential requests opened %d connections to the engine, want at most 2", n)
	}
	const workers = 16
	hammer(t, gw, workers, 800)
	if n := accepted.Load(); n > 2*workers+2 {
		t.Errorf("800 requests from %d clients opened %d connections to the engine, want at most %d", workers, n, 2*workers+2)
	}
}

// TestDefaultTransportPools: a gateway given no transport pools its
// proxied connections too. The bound is two per client, not one: a
// connection goes back to the pool from the transport's read loop after
// the response has reached the client, so under load a client's next
// request can find its previous connection not yet idle and dial another
// (which then stays pooled). Unpooled, 800 requests open about 800.
func TestDefaultTransportPools(t *testing.T) {
	engine, accepted := countedEngine(t)
	up, err := gateway.ParseUpstream(engine)
	if err != nil {
		t.Fatal(err)
	}
	g, err := gateway.New(testKeys(t), testkit.Limiter(t, ration.SystemClock{}), up) // bytes/4, no tokenize
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	const workers = 16
	hammer(t, srv.URL, workers, 800)
	if n := accepted.Load(); n > 2*workers {
		t.Errorf("800 requests from %d clients opened %d connections to the engine, want at most %d", workers, n, 2*workers)
	}
}
