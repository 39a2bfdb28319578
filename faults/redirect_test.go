//go:build faults

package faults

import (
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestRedirectKeepsTheToken points a gateway-demo process (-allocator) and
// the allocator binary's ops client (allocator cluster members, backup)
// at a fake allocator that answers every request 307 to another host, as
// a hostile or misconfigured one would. The other host must never see a
// request (so no bearer token), the gateway must log that it does not
// follow the redirect and still answer its clients (under its fallback
// policy), and the ops client must fail naming the redirect.
func TestRedirectKeepsTheToken(t *testing.T) {
	ctx := deadline(t, 60*time.Second)
	var elsewhere atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		http.Error(w, "not for you", http.StatusTeapot)
	}))
	defer other.Close()
	fake := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	}))
	fake.EnableHTTP2 = true
	fake.Config.Protocols = new(http.Protocols)
	fake.Config.Protocols.SetHTTP1(true)
	fake.Config.Protocols.SetUnencryptedHTTP2(true)
	fake.Start()
	defer fake.Close()

	k := key{Key: "sk-faults-redirect", ID: "faults-redirect", Tenant: "faults", RPM: 600}
	dir := t.TempDir()
	alloc := fakeAllocator{url: fake.URL, tokens: writeToken(t, dir)}
	gw := startGateway(ctx, t, "gateway", gatewaySpec{instances: 1, keysFile: writeKeys(t, k), alloc: alloc})
	code, err := sendChat(ctx, newLoadClient(1), gw.urls[0], k.Key)
	if err != nil || (code != http.StatusOK && code != http.StatusTooManyRequests) {
		t.Errorf("a request through the gateway: %d %v, want 200 or 429 from its fallback policy", code, err)
	}
	if err := poll(ctx, 20*time.Millisecond, func() (bool, error) {
		return strings.Contains(gw.logs.String(), "which is not followed"), nil
	}); err != nil {
		t.Errorf("the gateway never logged the redirect it did not follow: %v", err)
	}
	for _, args := range [][]string{{"cluster", "members"}, {"backup", "-out", dir + "/backup"}} {
		out, err := exec.CommandContext(ctx, bin.allocator, append(args, "-addr", fake.URL, "-admin-token-file", alloc.tokens)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "which -addr does not list") {
			t.Errorf("allocator %s against the redirecting member: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the host redirected to got %d requests", n)
	}
	gw.alive(t)
}

// fakeAllocator is an allocatorAddr for a test's own server.
type fakeAllocator struct{ url, tokens string }

func (f fakeAllocator) apiURL() string    { return f.url }
func (f fakeAllocator) tokenPath() string { return f.tokens }
