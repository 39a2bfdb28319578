// Package testkit holds the test scaffolding several packages share: an
// HTTP server on a loopback port that speaks HTTP/2 without TLS (h2c), as
// cmd/allocator does, a client for it (with a bearer token or not), a log buffer safe for concurrent
// writes, a Limiter constructor that fails the test on an error, a keys
// file writer, a cluster member's NOT_LEADER refusal, a test certificate
// authority (TLSFiles), and Do (an HTTP request sent and its body read). It
// is for tests only.
package testkit

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender"
)

// Limiter is spender.New, failing the test on an error.
func Limiter(t testing.TB, clk ration.Clock, opts ...spender.Option) *spender.Limiter {
	t.Helper()
	l, err := spender.New(clk, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// H2C serves h on a new loopback port, over HTTP/1.1 and h2c, until the
// test ends (the server is shut down in a t.Cleanup registered now, so it
// stops after whatever the test registers later). It returns the base
// URL, "http://127.0.0.1:port".
func H2C(t testing.TB, h http.Handler) string {
	t.Helper()
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: h, Protocols: p}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return "http://" + ln.Addr().String()
}

// H2CClient returns a client that speaks HTTP/2 without TLS, as a spender
// does to an allocator.
func H2CClient() *http.Client {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: p}}
}

// H2CClientWithToken is H2CClient sending "Authorization: Bearer token"
// on every request, as an allocator's caller with that token does.
func H2CClientWithToken(token string) *http.Client {
	c := H2CClient()
	c.Transport = bearer{token: token, next: c.Transport}
	return c
}

// bearer adds the Authorization header to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// SyncBuffer is a bytes.Buffer that is safe for concurrent use: a log
// sink that a test reads while a server writes to it.
type SyncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// KeysFile writes entries, encoded as JSON, as a gateway keys file in a
// new temp dir and returns its path.
func KeysFile(t testing.TB, entries any) string {
	t.Helper()
	b, err := json.Marshal(entries)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "keys.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Do sends req with http.DefaultClient and returns the response (its
// body read and closed) and the body, failing the test on an error.
func Do(t testing.TB, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}
