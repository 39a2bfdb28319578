package main

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rationhq/ration/internal/testkit"
)

func gatewayAddr(t *testing.T, f *fleet) string {
	t.Helper()
	return strings.TrimPrefix(f.instances[0].url, "http://")
}

// inBodyRead counts the goroutines reading a request body in the limit
// stage.
func inBodyRead() int {
	buf := make([]byte, 8<<20)
	return bytes.Count(buf[:runtime.Stack(buf, true)], []byte("spenderhttp.readBody("))
}

// At a real gateway: 40 connections that declare
// 16,000,000 bytes with a valid key and send no body used to take the
// process from 17 MB to 643 MB.
func TestDeclaredBodiesDoNotTakeMemory(t *testing.T) {
	const conns = 40
	f := startFleet(t, testConfig(t, 1, ""), nil)
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	before := m.HeapInuse
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-ration-demo-large\r\n" +
		"Content-Type: application/json\r\nContent-Length: 16000000\r\n\r\n"
	for i := range conns {
		c, err := net.DialTimeout("tcp", gatewayAddr(t, f), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, head); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for inBodyRead() < conns {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d requests reached the body read within 10s", inBodyRead(), conns)
		}
		time.Sleep(10 * time.Millisecond) // polling real connections' progress, not a clock
	}
	runtime.GC()
	runtime.ReadMemStats(&m)
	grew := int64(m.HeapInuse) - int64(before)
	t.Logf("heap in use grew %d KiB with %d bodies declared at 16 MB", grew>>10, conns)
	if grew > 100<<20 {
		t.Errorf("heap in use grew %d MB, want under 100 MB", grew>>20)
	}
}

// Idle keep-alive connections used to stay open for good (2000 for
// 25 s were seen; 200 here keep CI fast).
func TestGatewayClosesIdleConnections(t *testing.T) {
	cfg := testConfig(t, 1, "")
	cfg.limits.Idle = 300 * time.Millisecond
	cfg.limits.ReadHeader = 300 * time.Millisecond
	f := startFleet(t, cfg, nil)
	took := testkit.IdleConns(t, gatewayAddr(t, f), 200, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 5*time.Second)
	t.Logf("200 idle connections closed within %v", took)
}

// A body that declares 500 bytes and sends 80 used to
// hang until the client gave up; with a valid key it is 408, without one
// the 401 does not wait for it.
func TestGatewaySlowBodyIsCut(t *testing.T) {
	cfg := testConfig(t, 1, "")
	cfg.limits.Read = 500 * time.Millisecond
	f := startFleet(t, cfg, nil)
	body := `{"model":"echo","messages":[{"role":"user","content":"` + strings.Repeat("a", 40) + `"}]`
	for _, tc := range []struct {
		name, auth string
		want       []int
	}{
		{"valid key", "Authorization: Bearer sk-ration-demo-large\r\n", []int{http.StatusRequestTimeout, 0}},
		{"no key", "", []int{http.StatusUnauthorized, 0}},
	} {
		head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + tc.auth +
			"Content-Type: application/json\r\nContent-Length: 500\r\n\r\n"
		start := time.Now()
		code := testkit.SlowBody(t, gatewayAddr(t, f), head, body[:80], 5*time.Second)
		if code != tc.want[0] && code != tc.want[1] {
			t.Errorf("%s: status %d, want %d or a closed connection", tc.name, code, tc.want[0])
		}
		t.Logf("%s: status %d after %v", tc.name, code, time.Since(start))
	}
}
