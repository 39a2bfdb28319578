package allocator

import (
	"errors"
	"net/http"
	"testing"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/internal/testkit"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/proto/ration/lease/v1/leasev1connect"
)

// TestCredentialsOverTheWire: two tokens of one token file are two
// credentials. A spender id whose session one token's calls created is
// refused PermissionDenied under the other, and each token's calls count
// against its own quota (ResourceExhausted past it), so one token's flood
// leaves the other's calls alone. Past its quota, a token's Acquire calls
// are refused before they are read, even one that would fit, until a
// sweep; its Release goes through.
func TestCredentialsOverTheWire(t *testing.T) {
	mux := http.NewServeMux()
	l := newLedger(t, newFakeClock(), WithQuota(ledger.Quota{Sessions: 1, Keys: 2}))
	Mount(mux, NewService(l), BearerAuth([]string{"token-a", "token-b"}, nil))
	url := testkit.H2C(t, mux)
	client := func(token string) leasev1connect.LeaseServiceClient {
		return leasev1connect.NewLeaseServiceClient(connect.NewClient(connecthttp.NewTransport(testkit.H2CClientWithToken(token), url)))
	}
	a, b := client("token-a"), client("token-b")
	req := func(id string, seq uint64, keys ...string) *leasev1.AcquireRequest {
		r := &leasev1.AcquireRequest{Caller: &leasev1.Caller{SpenderId: id, Epoch: 1, Sequence: seq}}
		for _, k := range keys {
			r.Keys = append(r.Keys, &leasev1.KeyAcquire{Key: k, Limits: &leasev1.Limits{Rpm: 60}, Want: &leasev1.Amount{Requests: 1}})
		}
		return r
	}
	if _, err := a.Acquire(ctx, req("gw-a", 1, "k1", "k2")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, req("gw-a", 2, "k1")); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("token b under token a's spender id: %v, want PermissionDenied", err)
	}
	for _, r := range []*leasev1.AcquireRequest{req("gw-a", 2, "k3"), req("gw-a2", 1, "k1")} {
		if _, err := a.Acquire(ctx, r); connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Fatalf("token a past its quota: %v, want ResourceExhausted", err)
		}
	}
	if _, err := b.Acquire(ctx, req("gw-b", 1, "k3", "k4")); err != nil {
		t.Fatalf("token b beside token a's full quota: %v", err)
	}
	if !l.AtQuota(TokenID("token-a")) || l.AtQuota(TokenID("token-b")) {
		t.Fatal("AtQuota: want token a's only")
	}
	if _, err := a.Acquire(ctx, req("gw-a", 2, "k1")); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("token a at its quota, a call that fits: %v, want ResourceExhausted before the sweep", err)
	}
	if _, _, err := l.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctx, req("gw-a", 2, "k1")); err != nil {
		t.Fatalf("token a after a sweep, a call that fits: %v", err)
	}
	if TokenID("token-a") == TokenID("token-b") || len(TokenID("x")) != 16 {
		t.Fatalf("TokenID: %q %q", TokenID("token-a"), TokenID("x"))
	}
}

// TestKeyLimitsHeldByTheAllocator: with WithKeyLimits, a call's limits are
// replaced by the allocator's, so a caller can neither raise a key's limit
// (an rpm of 10^12 grants no more than the real one holds) nor lower it;
// an Acquire on a key the allocator does not know is refused naming the
// key's field, and a Release of one charges nothing.
func TestKeyLimitsHeldByTheAllocator(t *testing.T) {
	held := map[string]ration.Limits{"k": {RPM: 60}}
	l := newLedger(t, newFakeClock(), WithKeyLimits(func(key string) (ration.Limits, bool) { lim, ok := held[key]; return lim, ok }))
	want := ration.Amount{Requests: 1000}
	for i, lim := range []ration.Limits{{RPM: ration.MaxRate}, {RPM: 1}, {}} {
		r, err := l.Acquire(ctx, caller("gw", 1, uint64(i+1)), []ledger.AcquireKey{{Key: "k", Limits: lim, Want: want}})
		if err != nil {
			t.Fatal(err)
		}
		g := r.Keys[0]
		if g.Snapshot.Requests.Limit != 60 || (i == 0 && g.Granted.Requests != 60) || (i > 0 && g.Granted.Requests != 0) {
			t.Fatalf("call with limits %+v: %+v, want the key's 60 RPM", lim, g)
		}
	}
	_, err := l.Acquire(ctx, caller("gw", 1, 4), []ledger.AcquireKey{{Key: "k", Limits: ration.Limits{RPM: 60}}, {Key: "other", Limits: ration.Limits{RPM: 60}}})
	var ie *ledger.InputError
	if !errors.As(err, &ie) || ie.Field != "keys[1].key" {
		t.Fatalf("a key the allocator does not hold: %v, want an InputError on keys[1].key", err)
	}
	if _, err := l.Release(ctx, caller("gw", 1, 4), []ledger.ReleaseKey{{Key: "other", Limits: ration.Limits{RPM: 60}, Debt: ration.Amount{Requests: 5}}}); err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Keys != 1 {
		t.Fatalf("%d keys tracked, want 1 (the Release's unknown key charged nothing)", st.Keys)
	}
}
