//go:build faults

package faults

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/testkit"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/proto/ration/lease/v1/leasev1connect"
)

// hostileToken is a second token of the allocator's token file: another
// credential than the gateways', as a token stolen from another gateway
// (or handed to a hostile one) is.
const hostileToken = "faults-hostile-token"

// writeTokens writes a token file with the suite's token and the hostile
// one and returns its path.
func writeTokens(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(token+"\n"+hostileToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// leaseClient is a LeaseService client of the allocator at url sending
// tok as its bearer token.
func leaseClient(url, tok string) leasev1connect.LeaseServiceClient {
	return leasev1connect.NewLeaseServiceClient(connect.NewClient(connecthttp.NewTransport(testkit.H2CClientWithToken(tok), url)))
}

// huge is 2^50 in both dimensions: the largest amount a call may carry.
var huge = &leasev1.Amount{Requests: ration.MaxAmount, Tokens: ration.MaxAmount}

// attack is one hostile caller: every tick, it sends its next call and
// checks the answer it must get.
type attack struct {
	name  string
	key   key
	calls int
	fail  string // the first unexpected answer
	// call makes the i-th call (sequence i+1) and returns what was wrong
	// with its answer, "" if nothing.
	call func(ctx context.Context, c leasev1connect.LeaseServiceClient, i int) string
}

// TestHostileCallersLeaveAnHonestGateway runs one gateway-demo process
// (spender id "honest-1", the suite's token) sending each of four keys half
// its limit, evenly, for 30 s, on an allocator that holds the fleet's
// limits (-limits-file: the gateway's keys file) and accepts a second
// token. Under that token, four callers each attack one key, five times a
// second, as docs/bound.md ("Rules for callers") says they cannot:
//
//   - debt: an Acquire and a Release reporting a debt of 2^50;
//   - demand: an Acquire with a demand and a spend rate of 2^50 (its own
//     spender id, holding nothing: it takes its credential's max-min part
//     of the rate, half, and spends none of it);
//   - epoch: an Acquire under the honest gateway's spender id at an epoch
//     the bound allows (PERMISSION_DENIED: another credential's id), and
//     under that id and its own at 2^63-1 and 2^64-1 (INVALID_ARGUMENT on
//     caller.epoch);
//   - limits: an Acquire with rpm 10^12, then rpm 1 (answered with the
//     file's limit).
//
// Each attack's calls must get the answer the rule gives; every honest
// request is answered 200, with no 429 and none under the fallback policy;
// each key's admissions stay within C + ρ·(t + TTL); and the gateway never
// logs that the allocator refused its epoch.
func TestHostileCallersLeaveAnHonestGateway(t *testing.T) {
	const (
		rpm      = 600
		ttl      = 2 * time.Second
		duration = 30 * time.Second
	)
	ctx := deadline(t, duration+60*time.Second)
	var keys []key
	for _, name := range []string{"debt", "demand", "epoch", "limits"} {
		keys = append(keys, key{Key: "sk-faults-hostile-" + name, ID: "faults-hostile-" + name, Tenant: "faults", RPM: rpm})
	}
	keysFile := writeKeys(t, keys...)
	alloc := startAllocator(ctx, t, ttl, "", "-token-file", writeTokens(t), "-limits-file", keysFile)
	gw := startGateway(ctx, t, "gateway", gatewaySpec{instances: 1, keysFile: keysFile, alloc: alloc, spenderID: "honest"})
	lim := func(r int64) *leasev1.Limits { return &leasev1.Limits{Rpm: r} }
	caller := func(id string, epoch uint64, i int) *leasev1.Caller {
		return &leasev1.Caller{SpenderId: id, Epoch: epoch, Sequence: uint64(i + 1)}
	}
	ok := func(err error, what string) string {
		if err != nil {
			return fmt.Sprintf("%s: %v", what, err)
		}
		return ""
	}
	want := func(err error, code connect.Code, what string) string {
		if connect.CodeOf(err) != code {
			return fmt.Sprintf("%s: %v, want %v", what, err, code)
		}
		return ""
	}
	attacks := []*attack{
		{name: "debt", key: keys[0], call: func(ctx context.Context, c leasev1connect.LeaseServiceClient, i int) string {
			// Ten calls an epoch, the last a Release.
			id, epoch := "hostile-debt", uint64(i/10+1)
			if i%10 == 9 {
				_, err := c.Release(ctx, &leasev1.ReleaseRequest{Caller: caller(id, epoch, i%10),
					Keys: []*leasev1.KeyRelease{{Key: keys[0].ID, Limits: lim(rpm), Debt: huge}}})
				return ok(err, "Release with debt 2^50")
			}
			_, err := c.Acquire(ctx, &leasev1.AcquireRequest{Caller: caller(id, epoch, i%10),
				Keys: []*leasev1.KeyAcquire{{Key: keys[0].ID, Limits: lim(rpm), Debt: huge}}})
			return ok(err, "Acquire with debt 2^50")
		}},
		{name: "demand", key: keys[1], call: func(ctx context.Context, c leasev1connect.LeaseServiceClient, i int) string {
			r, err := c.Acquire(ctx, &leasev1.AcquireRequest{Caller: caller("hostile-demand", 1, i),
				Keys: []*leasev1.KeyAcquire{{Key: keys[1].ID, Limits: lim(rpm), Demand: huge, SpendRate: huge, Held: &leasev1.Amount{}}}})
			if err != nil {
				return fmt.Sprintf("Acquire with demand 2^50: %v", err)
			}
			// Its credential's max-min part: what the honest demand (about
			// half) leaves, not the 99.9% a proportional split of 2^50 gave.
			if s := r.GetKeys()[0].GetShare().GetRequestsPpm(); s > 600_000 {
				return fmt.Sprintf("demand 2^50 got a share of %d millionths", s)
			}
			return ""
		}},
		{name: "epoch", key: keys[2], call: func(ctx context.Context, c leasev1connect.LeaseServiceClient, i int) string {
			k := []*leasev1.KeyAcquire{{Key: keys[2].ID, Limits: lim(rpm)}}
			// An epoch the clock allows (an hour ahead) under the honest
			// gateway's id: another credential's.
			ahead := uint64(time.Now().Add(time.Hour).UnixNano())
			_, err := c.Acquire(ctx, &leasev1.AcquireRequest{Caller: caller("honest-1", ahead, 0), Keys: k})
			if s := want(err, connect.CodePermissionDenied, "Acquire under the honest gateway's id"); s != "" {
				return s
			}
			// Epochs beyond the bound, under any id.
			for _, id := range []string{"honest-1", "hostile-epoch"} {
				_, err = c.Acquire(ctx, &leasev1.AcquireRequest{Caller: caller(id, []uint64{math.MaxInt64, math.MaxUint64}[i%2], 0), Keys: k})
				if s := want(err, connect.CodeInvalidArgument, "Acquire at epoch 2^63-1 or 2^64-1"); s != "" || !strings.Contains(err.Error(), "caller.epoch") {
					return s + fmt.Sprintf(" (%v)", err)
				}
			}
			return ""
		}},
		{name: "limits", key: keys[3], call: func(ctx context.Context, c leasev1connect.LeaseServiceClient, i int) string {
			r := []int64{ration.MaxRate, 1}[i%2]
			resp, err := c.Acquire(ctx, &leasev1.AcquireRequest{Caller: caller("hostile-limits", 1, i),
				Keys: []*leasev1.KeyAcquire{{Key: keys[3].ID, Limits: lim(r)}}})
			if err != nil {
				return fmt.Sprintf("Acquire with rpm %d: %v", r, err)
			}
			if l := resp.GetKeys()[0].GetSnapshot().GetRequests().GetLimit(); l != rpm {
				return fmt.Sprintf("Acquire with rpm %d: answered on a limit of %d, want the file's %d", r, l, rpm)
			}
			return ""
		}},
	}

	// The honest load first, so that the gateway holds its shares when the
	// attacks start.
	var loads []*load
	for _, k := range keys {
		loads = append(loads, startLoad(ctx, loadSpec{key: k.Key, targets: gw.urls, rate: rpm / 60.0 / 2, workers: 4}))
	}
	pause(ctx, 3*time.Second)
	hostile := leaseClient(alloc.url(), hostileToken)
	actx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, a := range attacks {
		wg.Go(func() {
			tk := time.NewTicker(200 * time.Millisecond)
			defer tk.Stop()
			for ; ; a.calls++ {
				select {
				case <-actx.Done():
					return
				case <-tk.C:
				}
				if s := a.call(actx, hostile, a.calls); s != "" && a.fail == "" && actx.Err() == nil {
					a.fail = s
				}
			}
		})
	}
	pause(ctx, duration)
	stop()
	wg.Wait()
	var results []loadResult
	for _, l := range loads {
		results = append(results, l.stop(ctx, t))
	}
	for _, a := range attacks {
		if a.fail != "" {
			t.Errorf("%s attack: %s", a.name, a.fail)
		}
	}
	c := mustReadGateways(ctx, t, gw.urls)
	t.Logf("gateway: %.0f admitted (%.0f from leases, %.0f under fallback), %.0f refused", c.admitted, c.leased, c.fallback, c.rateLimited)
	t.Logf("allocator calls: %s", allocatorCalls(mustScrape(ctx, t, alloc.url()+"/metrics")))
	for i, r := range results {
		a := attacks[i]
		t.Logf("%s attack (%d calls): the honest clients saw %v", a.name, a.calls, r)
		r.only200or429(t)
		if n := r.count(http.StatusTooManyRequests); n > 0 {
			t.Errorf("%s attack: %d honest requests refused 429 at half the key's limit", a.name, n)
		}
		c := float64(rpm)
		if bound := c + c/60*(r.elapsed+ttl).Seconds(); float64(r.count(200)) > bound {
			t.Errorf("%s attack: %d admitted in %v, above C+ρ(t+TTL) = %.1f", a.name, r.count(200), r.elapsed, bound)
		}
	}
	if c.fallback > 0 {
		t.Errorf("%.0f honest requests admitted under the fallback policy", c.fallback)
	}
	noEpochTrouble(t, gw)
	gw.alive(t)
	alloc.alive(t)
}
