package spender_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect/v2"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/internal/testkit"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// serveAllocator serves an in-memory allocator over h2c on loopback,
// requiring token, and returns its base URL.
func serveAllocator(t *testing.T, clk *fakeclock.Clock, token string) string {
	t.Helper()
	return serveService(t, newAllocator(t, clk), token)
}

// serveService serves svc over h2c on loopback, requiring token, and
// returns its base URL.
func serveService(t testing.TB, svc *allocator.Service, token string) string {
	t.Helper()
	mux := http.NewServeMux()
	allocator.Mount(mux, svc, allocator.BearerAuth([]string{token}, nil))
	return testkit.H2C(t, mux)
}

// TestDialAllocator: a leased Limiter over the network, in each protocol,
// with the bearer token from a file; a wrong token is refused, and the
// Limiter says so: Reserve fails naming the cause (not a 429 from its
// fallback policy), Ready reports it, and, with no logger given, a line
// goes to slog.Default().
func TestDialAllocator(t *testing.T) {
	clk := fakeclock.New()
	base := serveAllocator(t, clk, "s3cret")
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("# the allocator's token\ns3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	lim := ration.Limits{RPM: 60, TPM: 6000}
	for _, proto := range []string{"connect", "grpc", "grpcweb"} {
		t.Run(proto, func(t *testing.T) {
			src, err := spender.DialAllocator(base, spender.WithTokenFile(tokenFile), spender.WithProtocol(proto))
			if err != nil {
				t.Fatal(err)
			}
			l := newLeased(t, clk, src, spender.WithSpenderID("gw-"+proto))
			r := mustReserve(t, l, "key-"+proto, lim, ration.Amount{Requests: 1, Tokens: 100})
			if s := r.Status(); s.RemainingRequests != 59 || s.RemainingTokens != 5900 {
				t.Fatalf("status over %s = %+v", proto, s)
			}
		})
	}
	t.Run("wrong token", func(t *testing.T) {
		src, err := spender.DialAllocator(base, spender.WithToken("nope"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := src.Acquire(context.Background(), nil); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("Acquire with a wrong token = %v, want Unauthenticated", err)
		}
		var logged testkit.SyncBuffer
		defer slog.SetDefault(slog.Default())
		slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
		// The real clock: the slow-path deadline and the retries run on it.
		// Even FailOpen: a refused credential is a misconfiguration, not an
		// outage to ride through.
		l := newLeased(t, ration.SystemClock{}, src, spender.WithFallback(spender.FailOpen), testTuning(50*time.Millisecond))
		_, err = l.Reserve(ctx, "k", lim, ration.Amount{Requests: 1})
		if !errors.Is(err, spender.ErrCredentialRefused) || !strings.Contains(err.Error(), "invalid bearer token") {
			t.Fatalf("Reserve with a refused token = %v, want ErrCredentialRefused with the allocator's reason", err)
		}
		if err := l.Ready(); !errors.Is(err, spender.ErrCredentialRefused) {
			t.Fatalf("Ready with a refused token = %v, want ErrCredentialRefused", err)
		}
		if out := logged.String(); !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "refused this spender's credential") {
			t.Fatalf("slog.Default() got %q, want an ERROR line naming the refused credential", out)
		}
	})
	for _, bad := range []string{"", "ftp://x", "localhost:1", "http://"} {
		if _, err := spender.DialAllocator(bad); err == nil {
			t.Errorf("DialAllocator(%q) accepted", bad)
		}
	}
	if _, err := spender.DialAllocator(base, spender.WithProtocol("smtp")); err == nil {
		t.Error("an unknown protocol was accepted")
	}
	if _, err := spender.DialAllocator(base, spender.WithTokenFile(filepath.Join(t.TempDir(), "missing"))); err == nil {
		t.Error("a missing token file was accepted")
	}
}

// TestDialAllocatorFollowsNoRedirect: an allocator URL that answers 307
// to another host (a fake or misconfigured allocator) fails the call with
// an error naming the redirect, and the other host never sees a request,
// so the bearer token goes nowhere but the listed URL.
func TestDialAllocatorFollowsNoRedirect(t *testing.T) {
	var elsewhere atomic.Int64
	other := testkit.H2C(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		http.Error(w, "should not be reached", http.StatusTeapot)
	}))
	fake := testkit.H2C(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	}))
	src, err := spender.DialAllocator(fake, spender.WithToken("s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = src.Acquire(context.Background(), &leasev1.AcquireRequest{})
	if err == nil || !strings.Contains(err.Error(), "redirect") || !strings.Contains(err.Error(), "not followed") {
		t.Fatalf("Acquire against a redirecting URL = %v, want an error saying the redirect is not followed", err)
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the host redirected to got %d requests", n)
	}
}
