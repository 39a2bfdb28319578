package spender_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/fakeclock"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// shareSource stands in for an allocator that grants refill shares. Every
// key of an Acquire is answered OK with the next grant queued in grants
// (nothing once they run out), held = the reported held + the grant (an
// honest ledger), the share and burst set on the source (none when the
// key sent no demand and onlyWithDemand is set), and a snapshot whose
// remaining is remaining. It drives the Limiter's machine itself, so a
// test moves the machine by hand on a fake clock: nothing is sent unless
// the test sends it.
type shareSource struct {
	m              *spender.Machine
	ttl            time.Duration
	share          ration.Share
	burst          ration.Amount
	remaining      ration.Amount
	grants         []ration.Amount
	onlyWithDemand bool
	calls          []*leasev1.AcquireRequest
}

func (s *shareSource) Drive(m *spender.Machine) { s.m = m }

func (s *shareSource) Acquire(_ context.Context, r *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	s.calls = append(s.calls, r)
	out := &leasev1.AcquireResponse{LeaseTtlUs: int64(s.ttl / time.Microsecond)}
	for _, k := range r.GetKeys() {
		var g ration.Amount
		if len(s.grants) > 0 {
			g, s.grants = s.grants[0], s.grants[1:]
		}
		held := ration.Amount{Requests: k.GetHeld().GetRequests(), Tokens: k.GetHeld().GetTokens()}.Add(g)
		lim := k.GetLimits()
		kg := &leasev1.KeyGrant{Status: leasev1.GrantStatus_GRANT_STATUS_OK, ActiveSpenders: 1,
			Granted: &leasev1.Amount{Requests: g.Requests, Tokens: g.Tokens},
			Held:    &leasev1.Amount{Requests: held.Requests, Tokens: held.Tokens},
			Snapshot: &leasev1.Snapshot{
				Requests: &leasev1.DimSnapshot{Limit: lim.GetRpm(), Remaining: s.remaining.Requests},
				Tokens:   &leasev1.DimSnapshot{Limit: lim.GetTpm(), Remaining: s.remaining.Tokens},
			}}
		dem := k.GetDemand()
		if !s.share.Zero() && (!s.onlyWithDemand || dem.GetRequests() > 0 || dem.GetTokens() > 0) {
			kg.Share = &leasev1.Share{RequestsPpm: s.share.Requests, TokensPpm: s.share.Tokens}
			kg.ShareBurst = &leasev1.Amount{Requests: s.burst.Requests, Tokens: s.burst.Tokens}
		}
		out.Keys = append(out.Keys, kg)
	}
	return out, nil
}

func (s *shareSource) ReserveAhead(context.Context, *leasev1.ReserveAheadRequest) (*leasev1.ReserveAheadResponse, error) {
	return nil, errors.New("shareSource: no reserve-ahead")
}

func (s *shareSource) Release(_ context.Context, r *leasev1.ReleaseRequest) (*leasev1.ReleaseResponse, error) {
	return &leasev1.ReleaseResponse{Returned: make([]*leasev1.Amount, len(r.GetKeys()))}, nil
}

// shareRig is one leased Limiter on a shareSource and a fake clock, on
// key "k" with limits lim.
type shareRig struct {
	t   *testing.T
	clk *fakeclock.Clock
	src *shareSource
	lim ration.Limits
	reg *prometheus.Registry
}

func newShareRig(t *testing.T, lim ration.Limits, src *shareSource) *shareRig {
	t.Helper()
	clk := fakeclock.New()
	reg := prometheus.NewPedanticRegistry()
	m, err := spender.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	l := newLimiter(t, clk, spender.WithLeases(src), spender.WithShards(1), spender.WithSpenderID("gw"), spender.WithEpoch(1),
		spender.WithMetrics(m), testTuning(50*time.Millisecond))
	t.Cleanup(func() { l.Close(context.Background()) })
	return &shareRig{t: t, clk: clk, src: src, lim: lim, reg: reg}
}

// reserve is one Reserve of c on the machine, without waiting: the
// reservation, the refusal, or a Wait when the allocator must be asked.
func (g *shareRig) reserve(c ration.Amount, w *spender.Wait) (spender.Reservation, error, *spender.Wait) {
	r, _, next, err := g.src.m.Reserve("k", g.lim, c, 0, false, w)
	if r == nil {
		return nil, err, next
	}
	return r, err, next
}

// send makes the machine's next call, answers it and delivers the answer,
// all now; it fails the test if there is no call to make.
func (g *shareRig) send() *leasev1.AcquireRequest {
	g.t.Helper()
	c := g.src.m.NextCall()
	if c == nil {
		g.t.Fatal("the machine has no call to make")
	}
	req := c.Acquire()
	resp, err := g.src.Acquire(ctx, req)
	g.src.m.Deliver(c, resp, err)
	return req
}

// prime gives the key a lease of grant (and the source's share) through
// one call, with a zero-cost Reserve.
func (g *shareRig) prime(grant ration.Amount) {
	g.t.Helper()
	g.src.grants = append(g.src.grants, grant)
	_, _, w := g.reserve(ration.Amount{}, nil)
	if w == nil {
		g.t.Fatal("prime: the first Reserve did not ask the allocator")
	}
	g.send()
	r, err, w := g.reserve(ration.Amount{}, w)
	if r == nil || err != nil || w != nil {
		g.t.Fatalf("prime: %v, %v, %v; want an admission", r, err, w)
	}
	r.Cancel()
}

// drain admits c locally until a Reserve is refused, and returns how many
// it admitted and the refusal; it fails the test if a Reserve would ask
// the allocator or if the machine has a call to make.
func (g *shareRig) drain(c ration.Amount) (int, *spender.RejectError) {
	g.t.Helper()
	for n := 0; ; n++ {
		r, err, w := g.reserve(c, nil)
		if w != nil {
			g.t.Fatalf("after %d admissions a Reserve asks the allocator", n)
		}
		if err != nil {
			var rej *spender.RejectError
			if !errors.As(err, &rej) {
				g.t.Fatalf("after %d admissions: %v", n, err)
			}
			if call := g.src.m.NextCall(); call != nil {
				g.t.Fatalf("after %d admissions and a refusal the machine calls the allocator: %v", n, call.Acquire())
			}
			return n, rej
		}
		if p := spender.AdmissionPath(r); p != spender.PathLease {
			g.t.Fatalf("admission %d on path %v, want a local one", n, p)
		}
	}
}

// advance moves the clock by d in steps of at most step, running the
// machine's maintenance after each.
func (g *shareRig) advance(d, step time.Duration) {
	for d > 0 {
		s := min(d, step)
		g.clk.Advance(s)
		g.src.m.Tick()
		d -= s
	}
}

// gauge reads the gauge family name's series with label dimension=dim.
func (g *shareRig) gauge(name, dim string) float64 {
	g.t.Helper()
	mfs, err := g.reg.Gather()
	if err != nil {
		g.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "dimension" && lp.GetValue() == dim {
					return m.GetGauge().GetValue() + m.GetCounter().GetValue()
				}
			}
		}
	}
	g.t.Fatalf("no series %s{dimension=%q}", name, dim)
	return 0
}

var (
	perMinute6000 = ration.Limits{RPM: 6000}             // 100 requests a second
	quarter       = ration.Share{Requests: 250_000}      // 25 requests a second
	oneRequest    = ration.Amount{Requests: 1}           //
	noRoom        = ration.Amount{}                      // the global bucket is empty
	plenty        = ration.Amount{Requests: 1_000_000}   // it has room
	tenK          = ration.Amount{Requests: 10_000}      // a burst that never binds here
	bothDims      = ration.Limits{RPM: 6000, TPM: 90000} //
)

// TestShareAccrual: a share of a quarter of 6000 requests a minute adds 25
// requests a second to the lease, admitted locally without an allocator
// call; accrual counts from the answer's receipt, stops at the burst, stops
// while a call carrying the key is in flight (the held it reports is what
// the spender may hold), and stops at the lease's expiry.
func TestShareAccrual(t *testing.T) {
	t.Run("25 a second, local", func(t *testing.T) {
		g := newShareRig(t, perMinute6000, &shareSource{ttl: time.Minute, share: quarter, burst: tenK, remaining: noRoom})
		g.prime(ration.Amount{Requests: 5})
		if n, _ := g.drain(oneRequest); n != 5 {
			t.Fatalf("admitted %d from the grant, want 5", n)
		}
		for i := range 4 {
			g.advance(time.Second, 250*time.Millisecond)
			if n, _ := g.drain(oneRequest); n != 25 {
				t.Fatalf("second %d: admitted %d, want 25", i+1, n)
			}
		}
		if len(g.src.calls) != 1 {
			t.Fatalf("%d allocator calls, want only the first", len(g.src.calls))
		}
		if got := g.gauge("ration_spender_share_accrued_total", "requests"); got != 100 {
			t.Errorf("share_accrued_total{requests} = %v, want 100", got)
		}
		if got := g.gauge("ration_spender_share_rate", "requests"); got != 1500 {
			t.Errorf("share_rate{requests} = %v, want 1500 a minute", got)
		}
	})

	t.Run("stops at the burst", func(t *testing.T) {
		g := newShareRig(t, perMinute6000, &shareSource{ttl: time.Minute, share: quarter, burst: ration.Amount{Requests: 30}, remaining: noRoom})
		g.prime(ration.Amount{Requests: 5})
		r, err, _ := g.reserve(ration.Amount{Requests: 4}, nil) // outstanding 4, avail 1
		if err != nil {
			t.Fatal(err)
		}
		g.advance(10*time.Second, 250*time.Millisecond) // 250 accrued, the burst holds
		r.Settle(ration.Amount{Requests: 1})            // a refund of 3 goes back into avail: avail + outstanding stays 30
		if n, _ := g.drain(oneRequest); n != 29 {
			t.Fatalf("admitted %d, want 29: avail + outstanding stopped at the burst (30) and the outstanding 1 was settled", n)
		}
		g.advance(200*time.Millisecond, 200*time.Millisecond)
		if n, _ := g.drain(oneRequest); n != 1 {
			t.Fatalf("admitted %d 200ms after the lease stood at the burst, want 1: avail + outstanding was 30 (the burst) until then", n)
		}
	})

	t.Run("from receipt, paused in flight", func(t *testing.T) {
		src := &shareSource{ttl: time.Minute, share: quarter, burst: tenK, remaining: noRoom}
		g := newShareRig(t, perMinute6000, src)
		src.grants = []ration.Amount{{Requests: 5}}
		_, _, w := g.reserve(oneRequest, nil)
		c := src.m.NextCall()
		g.advance(500*time.Millisecond, 500*time.Millisecond) // in flight for 500ms
		resp, _ := src.Acquire(ctx, c.Acquire())
		src.m.Deliver(c, resp, nil)
		if r, err, _ := g.reserve(oneRequest, w); r == nil {
			t.Fatalf("the waiting Reserve: %v", err)
		}
		if n, _ := g.drain(oneRequest); n != 4 {
			t.Fatalf("admitted %d at receipt, want 4: nothing accrues before the answer", n)
		}
		g.advance(time.Second, 250*time.Millisecond)
		if n, _ := g.drain(oneRequest); n != 25 {
			t.Fatalf("admitted %d a second after receipt, want 25", n)
		}

		// A second call carrying the key: its held is the lease after the
		// accrual up to the send, and nothing accrues until its answer.
		g.advance(400*time.Millisecond, 400*time.Millisecond) // 10 accrued
		// A cost the share cannot cover within the lease asks.
		_, _, w = g.reserve(ration.Amount{Requests: 2000}, nil)
		if w == nil {
			t.Fatal("a Reserve the share cannot cover within the lease did not ask")
		}
		c = src.m.NextCall()
		req := c.Acquire()
		if h := req.GetKeys()[0].GetHeld().GetRequests(); h != 40 {
			t.Fatalf("the call reports held %d, want 40 (30 admitted and unsettled, 10 accrued up to the send)", h)
		}
		g.advance(time.Second, 250*time.Millisecond) // in flight: 25 not accrued
		resp, _ = src.Acquire(ctx, req)              // grants nothing more
		src.m.Deliver(c, resp, nil)
		if n, _ := g.drain(oneRequest); n != 10 {
			t.Fatalf("admitted %d after a second in flight, want 10: no accrual while the key is in a call", n)
		}
		g.advance(40*time.Millisecond, 40*time.Millisecond)
		if n, _ := g.drain(oneRequest); n != 1 {
			t.Fatalf("admitted %d 40ms after the answer, want 1: the new share accrues from receipt", n)
		}
	})

	t.Run("stops at expiry", func(t *testing.T) {
		src := &shareSource{ttl: 2 * time.Second, share: quarter, burst: tenK, remaining: noRoom}
		g := newShareRig(t, perMinute6000, src)
		g.prime(ration.Amount{})
		g.clk.Advance(5 * time.Second) // no look until long past the expiry
		src.remaining = plenty
		_, _, w := g.reserve(oneRequest, nil)
		if w == nil {
			t.Fatal("a Reserve after the lease expired did not ask the allocator")
		}
		req := g.send()
		if h := req.GetKeys()[0].GetHeld().GetRequests(); h != 0 {
			t.Fatalf("the call after the expiry reports held %d, want 0: nothing accrued into an expired lease survives", h)
		}
		if got := g.gauge("ration_spender_share_accrued_total", "requests"); got != 0 {
			t.Fatalf("share_accrued_total{requests} = %v, want 0", got)
		}
	})
}

// TestShareLocalRefusal: with the lease short, a share that covers the
// shortfall within the lease and a global bucket reported empty, Reserve
// is refused locally with RetryAfter exactly the share's time to accrue
// the shortfall, and nothing is sent; otherwise the allocator is asked.
func TestShareLocalRefusal(t *testing.T) {
	both := ration.Share{Requests: 250_000, Tokens: 100_000} // 25 requests and 150 tokens a second
	for _, tc := range []struct {
		name      string
		lim       ration.Limits
		share     ration.Share
		burst     ration.Amount
		ttl       time.Duration
		grant     ration.Amount // the lease
		remaining ration.Amount
		cost      ration.Amount
		retry     time.Duration // 0: the allocator is asked
		dim       spender.Dimension
	}{
		{"one request short", perMinute6000, quarter, tenK, time.Minute, ration.Amount{}, noRoom, oneRequest, 40 * time.Millisecond, spender.Requests},
		{"tokens bind", bothDims, both, ration.Amount{Requests: 100, Tokens: 10_000}, time.Minute,
			ration.Amount{Requests: 5, Tokens: 100}, noRoom, ration.Amount{Requests: 1, Tokens: 300}, 1333334 * time.Microsecond, spender.Tokens},
		{"requests bind", bothDims, both, ration.Amount{Requests: 100, Tokens: 10_000}, time.Minute,
			ration.Amount{Tokens: 1000}, noRoom, ration.Amount{Requests: 3, Tokens: 300}, 120 * time.Millisecond, spender.Requests},
		{"room in the global bucket", perMinute6000, quarter, tenK, time.Minute, ration.Amount{}, plenty, oneRequest, 0, 0},
		{"global room below the shortfall", perMinute6000, quarter, tenK, time.Minute, ration.Amount{Requests: 2}, ration.Amount{Requests: 2}, ration.Amount{Requests: 5}, 120 * time.Millisecond, spender.Requests},
		{"global room covers the shortfall", perMinute6000, quarter, tenK, time.Minute, ration.Amount{Requests: 2}, ration.Amount{Requests: 3}, ration.Amount{Requests: 5}, 0, 0},
		{"cost above the burst", perMinute6000, quarter, ration.Amount{Requests: 10}, time.Minute, ration.Amount{}, noRoom, ration.Amount{Requests: 11}, 0, 0},
		{"the lease ends first", perMinute6000, quarter, tenK, 2 * time.Second, ration.Amount{}, noRoom, ration.Amount{Requests: 50}, 0, 0},
		{"no share in the short dimension", bothDims, quarter, tenK, time.Minute, ration.Amount{Requests: 5}, noRoom, ration.Amount{Requests: 1, Tokens: 10}, 0, 0},
		{"no share", perMinute6000, ration.Share{}, tenK, time.Minute, ration.Amount{}, noRoom, oneRequest, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &shareSource{ttl: tc.ttl, share: tc.share, burst: tc.burst, remaining: tc.remaining}
			g := newShareRig(t, tc.lim, src)
			g.prime(tc.grant)
			_, err, w := g.reserve(tc.cost, nil)
			if tc.retry == 0 {
				if w == nil {
					t.Fatalf("got %v, want the allocator asked", err)
				}
				return
			}
			var rej *spender.RejectError
			if w != nil || !errors.As(err, &rej) {
				t.Fatalf("got %v (wait %v), want a local refusal", err, w)
			}
			if rej.RetryAfter != tc.retry || rej.Dimension != tc.dim {
				t.Fatalf("RetryAfter %v on %v, want %v on %v", rej.RetryAfter, rej.Dimension, tc.retry, tc.dim)
			}
			if d, ok := tc.lim.AccrualTime(tc.share, tc.lim.Limited(tc.cost).Sub(tc.grant).Positive()); !ok || d != rej.RetryAfter {
				t.Fatalf("RetryAfter %v, AccrualTime says %v", rej.RetryAfter, d)
			}
			if c := src.m.NextCall(); c != nil || len(src.calls) != 1 {
				t.Fatalf("the refusal made a call: %v", c)
			}
			// And the share does cover it then.
			g.advance(rej.RetryAfter, rej.RetryAfter)
			if r, err, w := g.reserve(tc.cost, nil); r == nil {
				t.Fatalf("after RetryAfter: %v (wait %v), want an admission", err, w)
			}
		})
	}
}

// TestShareDemand: every Acquire entry carries the key's demand: what its
// traffic asked per minute, admitted and refused; once the traffic stops
// it falls to 0 and the share is given back.
func TestShareDemand(t *testing.T) {
	src := &shareSource{ttl: 2 * time.Second, share: quarter, burst: tenK, remaining: noRoom}
	g := newShareRig(t, perMinute6000, src)
	g.prime(ration.Amount{Requests: 5})
	if n, _ := g.drain(oneRequest); n != 5 {
		t.Fatalf("admitted %d, want 5", n)
	}
	for range 19 { // 20 refused in all (drain refused one)
		if _, err, _ := g.reserve(oneRequest, nil); err == nil {
			t.Fatal("admitted without a lease")
		}
	}
	g.clk.Advance(time.Second)
	src.m.Tick() // a renewal: half a TTL since the first send
	req := g.send().GetKeys()[0]
	if d, s := req.GetDemand().GetRequests(), req.GetSpendRate().GetRequests(); d != 1500 || s != 300 {
		t.Fatalf("demand %d, spend rate %d a minute; want 1500 (5 admitted + 20 refused in a second) and 300", d, s)
	}
	if d := req.GetDemand().GetTokens(); d != 0 {
		t.Fatalf("demand %d tokens on a key without a token limit, want 0", d)
	}

	// No traffic: the renewals' demand falls, and is 0 once the key has
	// been idle for a TTL (2s since its last request, at 0); that answer
	// brings no share, and then nothing accrues and nothing is sent.
	src.onlyWithDemand = true
	var zeroAt time.Duration
	for i := 1; i <= 20 && zeroAt == 0; i++ {
		g.advance(250*time.Millisecond, 250*time.Millisecond)
		if c := src.m.NextCall(); c != nil {
			req := c.Acquire()
			resp, err := src.Acquire(ctx, req)
			src.m.Deliver(c, resp, err)
			if req.GetKeys()[0].GetDemand().GetRequests() == 0 {
				zeroAt = time.Second + time.Duration(i)*250*time.Millisecond
			}
		}
	}
	// (At the first renewal once the key has been idle for a TTL: renewals
	// come every eighth of a TTL while the demand falls, at a maintenance.)
	if zeroAt == 0 || zeroAt > 2*time.Second+2*time.Second/8+250*time.Millisecond {
		t.Fatalf("the demand reached 0 at %v, want at the first renewal a TTL (2s) after the last request", zeroAt)
	}
	calls := len(src.calls)
	accrued := g.gauge("ration_spender_share_accrued_total", "requests")
	for range 20 {
		g.advance(250*time.Millisecond, 250*time.Millisecond)
		if c := src.m.NextCall(); c != nil {
			req := c.Acquire()
			resp, err := src.Acquire(ctx, req)
			src.m.Deliver(c, resp, err)
		}
	}
	if got := g.gauge("ration_spender_share_accrued_total", "requests"); got != accrued {
		t.Fatalf("accrued %v after the share was given back", got-accrued)
	}
	if got := g.gauge("ration_spender_share_rate", "requests"); got != 0 {
		t.Fatalf("share_rate{requests} = %v after the share was given back, want 0", got)
	}
	checkOnlyReturns(t, src.calls[calls:])
}

// checkOnlyReturns fails t unless calls, made after a key gave its share
// back, are at most one: the return of its unspent lease before it
// expires (not a renewal), with no demand.
func checkOnlyReturns(t *testing.T, calls []*leasev1.AcquireRequest) {
	t.Helper()
	if len(calls) > 1 {
		t.Fatalf("%d calls after the share was given back, want at most the return of the unspent lease", len(calls))
	}
	for _, c := range calls {
		if k := c.GetKeys()[0]; k.GetReturned().GetRequests() == 0 || k.GetDemand().GetRequests() != 0 {
			t.Fatalf("a call after the share was given back: returned %d, demand %d; want the unspent lease returned and no demand",
				k.GetReturned().GetRequests(), k.GetDemand().GetRequests())
		}
	}
}

// TestShareRenewal: a key holding a share is renewed about every half TTL
// while its demand holds, earlier (an eighth of a TTL) when its demand
// drops, and not at all once it holds no share.
func TestShareRenewal(t *testing.T) {
	const ttl = 4 * time.Second
	src := &shareSource{ttl: ttl, share: quarter, burst: tenK, remaining: noRoom, onlyWithDemand: true}
	g := newShareRig(t, perMinute6000, src)
	g.prime(ration.Amount{Requests: 100})
	var sends []time.Duration
	start := g.clk.Now()
	step := func() {
		g.clk.Advance(50 * time.Millisecond)
		src.m.Tick()
		if c := src.m.NextCall(); c != nil {
			resp, err := src.Acquire(ctx, c.Acquire())
			src.m.Deliver(c, resp, err)
			sends = append(sends, g.clk.Now().Sub(start))
		}
	}
	// 20 requests a second for 20 s: within the share (25), no refusal.
	for i := range 400 {
		if r, err, w := g.reserve(oneRequest, nil); r == nil {
			t.Fatalf("step %d: %v (wait %v)", i, err, w)
		}
		step()
	}
	if len(sends) < 9 || len(sends) > 11 {
		t.Fatalf("%d renewals in 20s at %v, want about 10 (every TTL/2 = %v)", len(sends), sends, ttl/2)
	}
	for i := 1; i < len(sends); i++ {
		if gap := sends[i] - sends[i-1]; gap < ttl/2 || gap > ttl/2+250*time.Millisecond {
			t.Fatalf("renewals at %v: a gap of %v, want TTL/2 (%v) to the next maintenance tick", sends, gap, ttl/2)
		}
	}
	// The traffic stops: renewed within an eighth of a TTL (and the next
	// maintenance), and then until the demand reaches 0 and the share is
	// given back; then no more calls.
	last, stop := sends[len(sends)-1], g.clk.Now().Sub(start)
	n := len(sends)
	for range 200 { // 10 s
		step()
	}
	if len(sends) == n {
		t.Fatal("no renewal after the traffic stopped")
	}
	// The demand since the last send includes the traffic before the stop:
	// it is below half once that interval is twice as long as the traffic
	// in it.
	if first := sends[n]; first < last+ttl/8 || first > max(last+ttl/8, stop+(stop-last))+250*time.Millisecond {
		t.Fatalf("first renewal after the traffic stopped (at %v, last send %v) came at %v, want from TTL/8 (%v) after the last send, once the demand since it is below half", stop, last, first, ttl/8)
	}
	// The demand reaches 0 once an interval between calls shows none of the
	// traffic expected at the estimate (eight requests or more), and at the
	// latest at the first renewal a TTL after the last request; then the
	// key holds no share and is not renewed.
	zero := -1
	for i, c := range src.calls {
		if c.GetKeys()[0].GetDemand().GetRequests() == 0 && i > 0 {
			zero = i
			break
		}
	}
	if zero < 0 {
		t.Fatalf("calls at %v: the demand never reached 0", sends)
	}
	if at := sends[zero-1]; at <= stop || at > stop+ttl+ttl/2+250*time.Millisecond {
		t.Fatalf("calls at %v: the demand reached 0 at %v, want after the traffic stopped at %v and by the first renewal a TTL (%v) after", sends, at, stop, ttl)
	}
	checkOnlyReturns(t, src.calls[zero+1:])
}

// TestNoShareNoChange: without a share (the allocator grants none), a key
// never accrues, never refuses on its own and is not renewed on a timer:
// the leased Limiter behaves as it did before shares.
func TestNoShareNoChange(t *testing.T) {
	src := &shareSource{ttl: 4 * time.Second, remaining: noRoom}
	g := newShareRig(t, perMinute6000, src)
	g.prime(ration.Amount{Requests: 3})
	for range 3 {
		if r, err, _ := g.reserve(oneRequest, nil); r == nil {
			t.Fatal(err)
		}
	}
	g.send() // the low watermark queued a refresh: it grants nothing
	g.advance(time.Second, 250*time.Millisecond)
	if _, _, w := g.reserve(oneRequest, nil); w == nil {
		t.Fatal("a Reserve without a lease or a share did not ask the allocator")
	}
	if got := g.gauge("ration_spender_share_accrued_total", "requests"); got != 0 {
		t.Fatalf("accrued %v without a share", got)
	}
}

// TestShareRenewalOnRisingDemand: a key whose traffic asks well above its
// share and the demand it last reported, and is refused, is renewed an
// eighth of a TTL after its last send, so that the allocator hears of the
// new demand early; once the demand it reports holds, every half TTL again.
func TestShareRenewalOnRisingDemand(t *testing.T) {
	const ttl = 4 * time.Second
	src := &shareSource{ttl: ttl, share: quarter, burst: tenK, remaining: noRoom}
	g := newShareRig(t, perMinute6000, src)
	g.prime(ration.Amount{}) // reports no demand
	start := g.clk.Now()
	var sends []time.Duration
	refused := 0
	for i := range 200 { // 10 s at 50 requests a second, twice the share
		for range 2 + i%2 {
			if _, err, w := g.reserve(oneRequest, nil); w != nil {
				t.Fatalf("step %d: a Reserve asks the allocator", i)
			} else if err != nil {
				refused++
			}
		}
		g.clk.Advance(50 * time.Millisecond)
		src.m.Tick()
		if c := src.m.NextCall(); c != nil {
			resp, err := src.Acquire(ctx, c.Acquire())
			src.m.Deliver(c, resp, err)
			sends = append(sends, g.clk.Now().Sub(start))
		}
	}
	if refused < 200 {
		t.Fatalf("%d refused, want about half of 500", refused)
	}
	if len(sends) < 2 || sends[0] < ttl/8 || sends[0] > ttl/8+250*time.Millisecond {
		t.Fatalf("renewals at %v, want the first an eighth of a TTL (%v) after the first send", sends, ttl/8)
	}
	if d := src.calls[1].GetKeys()[0].GetDemand().GetRequests(); d < 2550 || d > 3450 { // the estimate follows the last second closely: noisy
		t.Fatalf("the early renewal reports demand %d a minute, want about 3000", d)
	}
	for i := 2; i < len(sends); i++ {
		if gap := sends[i] - sends[i-1]; gap < ttl/2 {
			t.Fatalf("renewals at %v: a gap of %v, want TTL/2 (%v) once the reported demand holds", sends, gap, ttl/2)
		}
	}
}

// TestShareReserveAll: a request charged to two budgets is refused locally
// when one budget's share covers its shortfall and its global bucket is
// empty, naming that budget, with its share's time and no allocator call;
// nothing is charged to the other.
func TestShareReserveAll(t *testing.T) {
	src := &shareSource{ttl: time.Minute, share: quarter, burst: tenK, remaining: noRoom}
	g := newShareRig(t, perMinute6000, src)
	team := ration.Limits{RPM: 60}
	src.grants = []ration.Amount{{Requests: 10}, {}}
	charges := []spender.Charge{{Key: "team", Limits: team, Cost: oneRequest}, {Key: "k", Limits: perMinute6000, Cost: oneRequest}}
	_, w, err := src.m.ReserveAll(charges, nil)
	if w == nil {
		t.Fatalf("first ask: %v, want a wait", err)
	}
	g.send() // team: 10 requests and the share of its own 60 a minute; k: nothing but its share
	_, w, err = src.m.ReserveAll(charges, w)
	var rej *spender.RejectError
	if w != nil || !errors.As(err, &rej) || rej.Key != "k" || rej.RetryAfter != 40*time.Millisecond {
		t.Fatalf("got %v (wait %v), want k refused with RetryAfter 40ms", err, w)
	}
	if c := src.m.NextCall(); c != nil {
		t.Fatalf("the refusal made a call: %v", c.Acquire())
	}
	g.clk.Advance(40 * time.Millisecond)
	r, w, err := src.m.ReserveAll(charges, nil)
	if r == nil {
		t.Fatalf("after RetryAfter: %v (wait %v), want both admitted", err, w)
	}
	rs := r
	if p := spender.AdmissionPath(rs.Part(0)); p != spender.PathLease {
		t.Fatalf("team admitted on path %v, want local", p)
	}
	// The refusal charged nothing: the team's 10 less this one are left.
	for i := range 10 {
		r, w, err := src.m.ReserveAll(charges[:1], nil)
		if i < 9 && r == nil || i == 9 && (r != nil || w != nil || !errors.As(err, &rej) || rej.Key != "team") {
			t.Fatalf("team request %d alone: %v, %v, %v; want 9 admitted, then refused by the team's share", i, r, w, err)
		}
	}
}

// TestShareRenewalIgnoresNoise: a gateway that sees a request every
// second and a half, above its share, renews on the timer: the estimate's
// jump at each request is within its noise at that rate. When its traffic
// jumps to twelve a second it renews soon after, not on the timer.
func TestShareRenewalIgnoresNoise(t *testing.T) {
	const ttl = 8 * time.Second
	const tick = 250 * time.Millisecond
	perMinute60 := ration.Limits{RPM: 60} // one request a second; the share a quarter of it
	src := &shareSource{ttl: ttl, share: quarter, burst: tenK, remaining: noRoom}
	g := newShareRig(t, perMinute60, src)
	g.prime(ration.Amount{})
	start := g.clk.Now()
	var sends []time.Duration
	// run ticks n times, offering perTick(i) requests at the start of tick i.
	run := func(n int, perTick func(i int) int) {
		for i := range n {
			for range perTick(i) {
				if _, _, w := g.reserve(oneRequest, nil); w != nil {
					t.Fatalf("a Reserve asks the allocator")
				}
			}
			g.clk.Advance(tick)
			src.m.Tick()
			if c := src.m.NextCall(); c != nil {
				resp, err := src.Acquire(ctx, c.Acquire())
				src.m.Deliver(c, resp, err)
				sends = append(sends, g.clk.Now().Sub(start))
			}
		}
	}
	run(240, func(i int) int { // 60 s, a request every 1.5 s
		if i%6 == 0 {
			return 1
		}
		return 0
	})
	quiet := len(sends)
	for i := 3; i < quiet; i++ { // past the estimate's warm-up
		if gap := sends[i] - sends[i-1]; gap < ttl/2 {
			t.Fatalf("renewals at %v: a gap of %v at a steady 0.67 a second, want TTL/2 (%v)", sends[:quiet], gap, ttl/2)
		}
	}
	jump, last := g.clk.Now().Sub(start), sends[quiet-1]
	run(12, func(int) int { return 3 }) // 3 s at 12 a second
	due := max(jump+time.Second, last+ttl/8)
	if len(sends) == quiet || sends[quiet] > due {
		t.Fatalf("renewals at %v; after the jump at %v, want one by %v (a second after it, an eighth of a TTL after the last send at %v)", sends, jump, due, last)
	}
}

// TestShareGivesBackWhenSilent: a gateway whose traffic stops gives its
// whole share back with its next call, once the silence would have seen
// sixteen requests at the demand it last reported: demand 0, not the
// estimate on its way down.
func TestShareGivesBackWhenSilent(t *testing.T) {
	const ttl = 4 * time.Second
	const tick = 50 * time.Millisecond
	src := &shareSource{ttl: ttl, share: quarter, burst: tenK, remaining: noRoom}
	g := newShareRig(t, perMinute6000, src)
	g.prime(ration.Amount{})
	step := func(offer bool) *leasev1.AcquireRequest {
		if offer {
			g.reserve(oneRequest, nil) // 20 a second, within the share
		}
		g.clk.Advance(tick)
		src.m.Tick()
		if c := src.m.NextCall(); c != nil {
			req := c.Acquire()
			resp, err := src.Acquire(ctx, req)
			src.m.Deliver(c, resp, err)
			return req
		}
		return nil
	}
	for range 100 { // 5 s at 20 a second: renewals every TTL/2 report about 1200 a minute
		step(true)
	}
	stop := g.clk.Now()
	for i := 0; ; i++ {
		req := step(false)
		if req == nil {
			if i > 40 {
				t.Fatalf("no call within 2 s of the traffic stopping")
			}
			continue
		}
		after := g.clk.Now().Sub(stop)
		if d := req.GetKeys()[0].GetDemand().GetRequests(); d != 0 {
			t.Fatalf("the first call %v after the traffic stopped reports demand %d a minute, want 0", after, d)
		}
		// 16 requests at 1200 a minute take 0.8 s; the renewal waits at
		// least an eighth of a TTL after the last send.
		if after > 800*time.Millisecond+ttl/8+2*tick {
			t.Fatalf("the share went back %v after the traffic stopped, want within 0.8 s and an eighth of a TTL", after)
		}
		return
	}
}
