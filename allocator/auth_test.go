package allocator

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"

	"github.com/rationhq/ration/internal/testkit"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/proto/ration/lease/v1/leasev1connect"
)

// TestBearerAuthLogsRefusalsSampled: calls with a wrong token are refused
// with Unauthenticated, and logged for the 1st, 2nd and 4th of five.
func TestBearerAuthLogsRefusalsSampled(t *testing.T) {
	var logs testkit.SyncBuffer
	mux := http.NewServeMux()
	Mount(mux, NewService(newLedger(t, newFakeClock())), BearerAuth([]string{"tok"}, slog.New(slog.NewTextHandler(&logs, nil))))
	url := testkit.H2C(t, mux)
	hc := testkit.H2CClient()
	hc.Transport = wrongToken{hc.Transport}
	client := leasev1connect.NewLeaseServiceClient(connect.NewClient(connecthttp.NewTransport(hc, url)))
	ctx := context.Background()
	for range 5 {
		_, err := client.Release(ctx, &leasev1.ReleaseRequest{Caller: &leasev1.Caller{SpenderId: "s", Epoch: 1, Sequence: 1}})
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("Release with a wrong token: %v, want Unauthenticated", err)
		}
	}
	if n := strings.Count(logs.String(), "refused a call without a valid bearer token"); n != 3 {
		t.Fatalf("%d log lines for 5 refusals, want 3 (the 1st, 2nd and 4th):\n%s", n, logs.String())
	}
}

// wrongToken sends "Authorization: Bearer wrong" on every request.
type wrongToken struct{ next http.RoundTripper }

func (w wrongToken) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer wrong")
	return w.next.RoundTrip(r)
}

// TestRequireBearer: a plain HTTP handler behind the tokens answers 401
// without one of them (sampled in the log as BearerAuth's refusals), and
// runs with either token.
func TestRequireBearer(t *testing.T) {
	var logs testkit.SyncBuffer
	h := RequireBearer([]string{"tok", "other"}, slog.New(slog.NewTextHandler(&logs, nil)),
		http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("in")) }))
	for _, tc := range []struct {
		header string
		code   int
	}{{"", 401}, {"Bearer wrong", 401}, {"Basic tok", 401}, {"Bearer tok", 200}, {"bearer other", 200}, {"Bearer tok ", 401}} {
		r, _ := http.NewRequest("GET", "/admin/cluster", nil)
		if tc.header != "" {
			r.Header.Set("Authorization", tc.header)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.code || (tc.code == 200) != (w.Body.String() == "in") {
			t.Errorf("Authorization %q: %d %q, want %d", tc.header, w.Code, w.Body.String(), tc.code)
		}
	}
	if n := strings.Count(logs.String(), `procedure="GET /admin/cluster"`); n != 3 {
		t.Fatalf("%d refusals logged of 4, want 3 (the 1st, 2nd and 4th):\n%s", n, logs.String())
	}
}
