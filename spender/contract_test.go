package spender_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"connectrpc.com/connect/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/internal/fakeclock"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// rigGateway is one leased Limiter of a fleetRig, whose machine the rig
// moves itself (as the simulator does): its calls reach the allocator at
// once, or fail while the gateway is cut off.
type rigGateway struct {
	m     *spender.Machine
	svc   *allocator.Service
	reg   *prometheus.Registry
	l     *spender.Limiter
	cut   bool // calls fail as a refused connection would
	calls int  // Acquire calls that reached the allocator
}

func (g *rigGateway) Drive(m *spender.Machine) { g.m = m }

func (g *rigGateway) Acquire(ctx context.Context, r *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	return g.svc.Acquire(ctx, r)
}

func (g *rigGateway) ReserveAhead(ctx context.Context, r *leasev1.ReserveAheadRequest) (*leasev1.ReserveAheadResponse, error) {
	return g.svc.ReserveAhead(ctx, r)
}

func (g *rigGateway) Release(ctx context.Context, r *leasev1.ReleaseRequest) (*leasev1.ReleaseResponse, error) {
	return g.svc.Release(ctx, r)
}

// fleetRig is n leased Limiters on one in-process allocator and one fake
// clock, moved by hand: nothing happens between the rig's calls.
type fleetRig struct {
	t   testing.TB
	clk *fakeclock.Clock
	led *allocator.Ledger
	svc *allocator.Service
	gws []*rigGateway
}

func newFleetRig(t testing.TB, n int, ttl time.Duration, opts ...allocator.Option) *fleetRig {
	t.Helper()
	clk := fakeclock.New()
	led, err := allocator.New(append([]allocator.Option{allocator.WithClock(clk), allocator.WithTTL(ttl)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { led.Close() })
	f := &fleetRig{t: t, clk: clk, led: led, svc: allocator.NewService(led)}
	for i := range n {
		g := &rigGateway{svc: f.svc, reg: prometheus.NewPedanticRegistry()}
		m, err := spender.NewMetrics(g.reg)
		if err != nil {
			t.Fatal(err)
		}
		g.l = newLimiter(t, clk, spender.WithLeases(g), spender.WithSpenderID("gw"+string(rune('a'+i))), spender.WithEpoch(1),
			spender.WithMetrics(m), testTuning(50*time.Millisecond))
		f.gws = append(f.gws, g)
	}
	return f
}

// pump runs every gateway's maintenance and sends every call they have,
// delivering each answer (or a failure, to a cut-off gateway) at once.
func (f *fleetRig) pump() {
	for _, g := range f.gws {
		g.m.Tick()
		n := 0
		for c := g.m.NextCall(); c != nil; c = g.m.NextCall() {
			if n++; n > 100 {
				f.t.Fatalf("at %v a gateway made 100 calls at once; the last: %v", f.clk.Now().Sub(fakeclock.Epoch()), c.Method())
			}
			if g.cut {
				g.m.Deliver(c, nil, connect.NewError(connect.CodeUnavailable, "cut off"))
				break // resent after its backoff
			}
			if r := c.Ahead(); r != nil {
				resp, err := g.svc.ReserveAhead(context.Background(), r)
				g.m.DeliverAhead(c, resp, err)
				continue
			}
			g.calls++
			resp, err := g.svc.Acquire(context.Background(), c.Acquire())
			g.m.Deliver(c, resp, err)
		}
	}
}

// advance moves the clock by d in steps of at most step, pumping after each.
func (f *fleetRig) advance(d, step time.Duration) {
	for d > 0 {
		s := min(d, step)
		f.clk.Advance(s)
		f.pump()
		d -= s
	}
}

// reserve is a Reserve of c for key on gateway i: it waits for the
// allocator's answers as the Limiter's driver does (the clock moves on
// only when a waiter must reach its deadline).
func (f *fleetRig) reserve(i int, key string, lim ration.Limits, c ration.Amount) (spender.Reservation, error) {
	f.t.Helper()
	g := f.gws[i]
	var w *spender.Wait
	for range 1000 {
		r, _, next, err := g.m.Reserve(key, lim, c, 0, false, w)
		if next == nil {
			if r == nil {
				return nil, err
			}
			return r, err
		}
		if w != nil && next == w {
			// Nothing changed since the last look: let the deadline pass.
			if d := next.Deadline().Sub(f.clk.Now()); d > 0 {
				f.clk.Advance(d)
			}
		}
		w = next
		f.pump()
	}
	f.t.Fatal("a Reserve kept waiting")
	return nil, nil
}

// metric reads the sum of gateway i's series of family name that carry
// the label pairs in labels (name, value, name, value...).
func (f *fleetRig) metric(i int, name string, labels ...string) float64 {
	f.t.Helper()
	return metricOf(f.t, f.gws[i].reg, name, labels...)
}

// metricOf reads the sum of g's series (gauges and counters) of family name
// that carry the label pairs in labels (name, value, name, value...).
func metricOf(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for j := 0; j+1 < len(labels); j += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || lp.GetName() == labels[j] && lp.GetValue() == labels[j+1]
				}
				if !found {
					continue series
				}
			}
			sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return sum
}

// fleetMetric is metric summed over every gateway.
func (f *fleetRig) fleetMetric(name string, labels ...string) float64 {
	var sum float64
	for i := range f.gws {
		sum += f.metric(i, name, labels...)
	}
	return sum
}

// checkRemaining fails the test unless a refusal's remaining figure in the
// dimension it names is below what was asked: the 429's message and
// headers read it.
func checkRemaining(t testing.TB, rej *spender.RejectError) {
	t.Helper()
	rem, cost := rej.Status.RemainingTokens, rej.Cost.Tokens
	if rej.Dimension == spender.Requests {
		rem, cost = rej.Status.RemainingRequests, rej.Cost.Requests
	}
	if !rej.Oversize && rem >= cost {
		t.Fatalf("a refusal on %v says %d remaining for %d requested: %v", rej.Dimension, rem, cost, rej)
	}
}

// honouringClient sends one request at a time, each to a random gateway
// of a rig, for one key: after an admission it waits think, after a
// refusal exactly ⌈Retry-After⌉ (as the SDKs do). An ideal single bucket
// is offered the same requests at the same instants, for the exact wait
// of each refusal.
type honouringClient struct {
	f       *fleetRig
	lim     ration.Limits
	cost    ration.Amount
	think   time.Duration
	service time.Duration // how long an admitted request runs before it is settled
	step    time.Duration // the rig's maintenance steps while the client waits
	rng     *rand.Rand
	ideal   *spender.Limiter
	ck      *fakeclock.Clock // the ideal's

	sent, admitted, retries, retriesAdmitted int
	// late is, per refusal, the wait told minus the ideal's exact wait
	// (0 when the ideal admitted).
	late []time.Duration
}

func newHonouringClient(t testing.TB, f *fleetRig, lim ration.Limits, cost ration.Amount, think time.Duration, seed uint64) *honouringClient {
	ck := fakeclock.New()
	return &honouringClient{f: f, lim: lim, cost: cost, think: think, step: 500 * time.Millisecond, // (maintenance every other interval: the test's time under -race)
		rng: rand.New(rand.NewPCG(seed, 1)), ideal: newLimiter(t, ck), ck: ck}
}

func (hc *honouringClient) run(d time.Duration) {
	t := hc.f.t
	t.Helper()
	end := hc.f.clk.Now().Add(d)
	retry := false
	for hc.f.clk.Now().Before(end) {
		hc.ck.Set(hc.f.clk.Now())
		ir, ierr := hc.ideal.Reserve(ctx, "k", hc.lim, hc.cost)
		if ir != nil {
			ir.Settle(hc.cost)
		}
		r, err := hc.f.reserve(hc.rng.IntN(len(hc.f.gws)), "k", hc.lim, hc.cost)
		hc.sent++
		if retry {
			hc.retries++
		}
		wait := hc.think
		if err == nil {
			hc.admitted++
			if retry {
				hc.retriesAdmitted++
			}
			hc.f.advance(hc.service, hc.step)
			r.Settle(hc.cost)
			retry = false
		} else {
			var rej *spender.RejectError
			if !errors.As(err, &rej) || rej.Oversize {
				t.Fatalf("request %d: %v, want a refusal with a wait", hc.sent, err)
			}
			checkRemaining(t, rej)
			var exact time.Duration
			if irej := (*spender.RejectError)(nil); errors.As(ierr, &irej) {
				exact = irej.RetryAfter
			}
			hc.late = append(hc.late, rej.RetryAfter-exact)
			wait, retry = time.Duration(spender.RetryAfterSeconds(rej.RetryAfter))*time.Second, true
		}
		hc.f.advance(wait, hc.step)
	}
}

// TestLeasedRetryAfterIsHonoured: a client that comes back exactly when a
// 429's Retry-After says (rounded up, as the SDKs do) is admitted: on a
// 3 RPM key (no refill shares: they would not accrue a request between
// renewals), alone or spread over 3 and 8 gateways, every time, and the
// wait told is the ideal single bucket's exact wait; on a 60 RPM key with
// one gateway holding a share, the same. With the key's refill split in
// shares over 3 gateways, each gateway tells the time its own share (or
// the key's bucket, at what the shares leave it) takes, about 3 times the
// single bucket's wait, and a retry that lands on another gateway can find
// its share just spent: at least 90% admitted, the wait at the median
// within 3.5 times the exact one plus 1 s. Each refusal's remaining figure
// is below what was asked.
func TestLeasedRetryAfterIsHonoured(t *testing.T) {
	for _, tc := range []struct {
		name    string
		n       int
		strict  bool
		lim     ration.Limits
		think   time.Duration
		shares  bool
		percent int     // honoured retries admitted, at least
		late    float64 // the median wait told at most late × the exact wait + 1 s
	}{
		{"3 RPM, 1 gateway", 1, false, ration.Limits{RPM: 3, TPM: 1000}, time.Second, false, 100, 1.1},
		{"3 RPM, 3 gateways", 3, false, ration.Limits{RPM: 3, TPM: 1000}, time.Second, false, 100, 1.1},
		{"3 RPM, 8 gateways", 8, false, ration.Limits{RPM: 3, TPM: 1000}, time.Second, false, 100, 1.1},
		// Strict: the allocator counts a request held until told it settled,
		// and the cap (level + holdings <= C) burns refill meanwhile.
		{"3 RPM, 8 gateways, strict", 8, true, ration.Limits{RPM: 3, TPM: 1000}, time.Second, false, 100, 1.1},
		{"60 RPM, 1 gateway with a share", 1, false, ration.Limits{RPM: 60, TPM: 6000}, 0, true, 100, 1.1},
		{"60 RPM, 3 gateways with shares", 3, false, ration.Limits{RPM: 60, TPM: 6000}, 0, true, 90, 3.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleetRig(t, tc.n, 10*time.Second, allocator.WithStrict(tc.strict))
			hc := newHonouringClient(t, f, tc.lim, ration.Amount{Requests: 1, Tokens: 30}, tc.think, 1)
			if tc.think > 0 {
				hc.service = 2 * time.Second // requests that run a while: the allocator counts them held until told
			}
			hc.run(10 * time.Minute)
			shared := f.fleetMetric("ration_spender_share_accrued_total") > 0
			slices.Sort(hc.late)
			p50 := hc.late[len(hc.late)/2]
			t.Logf("%d sent, %d admitted; %d of %d honoured retries admitted; told minus exact: p50 %v, max %v; shares: %v",
				hc.sent, hc.admitted, hc.retriesAdmitted, hc.retries, p50, hc.late[len(hc.late)-1], shared)
			if hc.retries < 20 || hc.retriesAdmitted*100 < hc.retries*tc.percent {
				t.Errorf("%d of %d honoured retries admitted, want at least %d%%", hc.retriesAdmitted, hc.retries, tc.percent)
			}
			exact := time.Duration(float64(time.Minute) / float64(tc.lim.RPM)) // a request's refill
			if limit := time.Second + time.Duration((tc.late-1)*float64(exact)); p50 > limit {
				t.Errorf("Retry-After at the median %v later than the exact wait, want at most %v", p50, limit)
			}
			if shared != tc.shares {
				t.Errorf("refill shares accrued: %v, want %v", shared, tc.shares)
			}
		})
	}
}

// TestLeasedPerDayWaitIsInHours: a key of 5 requests a day says, once
// spent, to come back in hours, on every gateway (not a share's renewal
// period), and a client that does is admitted.
func TestLeasedPerDayWaitIsInHours(t *testing.T) {
	f := newFleetRig(t, 3, 10*time.Second)
	lim := ration.Limits{RPM: 5, Window: 24 * time.Hour}
	c := ration.Amount{Requests: 1}
	for i := range 5 {
		r, err := f.reserve(i%3, "k", lim, c)
		if err != nil {
			t.Fatalf("request %d of the day's 5: %v", i+1, err)
		}
		r.Settle(c)
		f.advance(time.Second, 250*time.Millisecond)
	}
	var longest time.Duration
	for i := range 3 {
		_, err := f.reserve(i, "k", lim, c)
		var rej *spender.RejectError
		if !errors.As(err, &rej) || rej.RetryAfter < 4*time.Hour || rej.RetryAfter > 5*time.Hour {
			t.Fatalf("gateway %d, the sixth request: %v; want a wait of 4.8 h less the seconds gone", i, err)
		}
		checkRemaining(t, rej)
		longest = max(longest, rej.RetryAfter)
	}
	f.advance(time.Duration(spender.RetryAfterSeconds(longest))*time.Second, time.Minute)
	if _, err := f.reserve(1, "k", lim, c); err != nil {
		t.Fatalf("at the wait told: %v", err)
	}
}

// TestLeasedIdleKeyGivesEverythingBack: within one TTL of a key's last
// request on a gateway, whatever that request's answer (a 429 on the small
// key, an admission on the busy one, which held a refill share), the
// gateway has given everything back: it holds no key (keys_held 0), the
// allocator holds nothing for it (no holding left), and it makes no more
// calls. Another gateway 75 s later finds the small key's whole burst.
func TestLeasedIdleKeyGivesEverythingBack(t *testing.T) {
	const ttl = 10 * time.Second
	for _, tc := range []struct {
		name    string
		lim     ration.Limits
		sent    int           // requests on gateway 0, every gap
		gap     time.Duration //
		refused bool          // the last one was refused
	}{
		{"3 RPM, the last answer a 429", ration.Limits{RPM: 3, TPM: 1000}, 5, 100 * time.Millisecond, true},
		{"600 RPM with a share, the last answer a 200", ration.Limits{RPM: 600}, 200, 200 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleetRig(t, 2, ttl)
			c := ration.Amount{Requests: 1, Tokens: 30}
			var err error
			for range tc.sent {
				var r spender.Reservation
				if r, err = f.reserve(0, "k", tc.lim, c); err == nil {
					r.Settle(c)
				}
				f.advance(tc.gap, tc.gap)
			}
			if refused := err != nil; refused != tc.refused {
				t.Fatalf("the last request: %v, want refused: %v", err, tc.refused)
			}
			if f.metric(0, "ration_spender_keys_held") != 1 {
				t.Fatal("the gateway holds nothing while in use")
			}
			f.advance(ttl-tc.gap, 250*time.Millisecond)
			held, holdings := f.metric(0, "ration_spender_keys_held"), f.led.Stats().Holdings
			calls := f.gws[0].calls
			f.advance(10*time.Minute, 250*time.Millisecond)
			if held != 0 || holdings != 0 || f.gws[0].calls != calls {
				t.Errorf("a TTL after the last request: keys_held %v, allocator holdings %d, and %d calls in the next 10 minutes; want 0, 0, 0",
					held, holdings, f.gws[0].calls-calls)
			}
		})
	}
	t.Run("another gateway after 75 s", func(t *testing.T) {
		f := newFleetRig(t, 3, ttl)
		lim, c := ration.Limits{RPM: 3, TPM: 1000}, ration.Amount{Requests: 1, Tokens: 30}
		for _, i := range []int{0, 1, 2, 2} { // the README's tour: the fourth is refused
			if r, err := f.reserve(i, "k", lim, c); err == nil {
				r.Settle(c)
			}
		}
		f.advance(75*time.Second, 250*time.Millisecond)
		n := 0
		for range 4 {
			if r, err := f.reserve(1, "k", lim, c); err == nil {
				n++
				r.Settle(c)
			}
		}
		if n != 3 {
			t.Errorf("after 75 idle seconds another gateway admitted %d of 4, want 3 (the whole burst)", n)
		}
	})
}

// TestLeasedOutageKeepsAKeyBelowItsLimit: 1 to 6 gateways sending a key of
// 600 or 3000 RPM at 10% to 50% of its limit, evenly, see no 429 while the
// allocator is cut off from all of them (an allocator failover, from the
// gateways' side) for 0.5 to 15 s, with a TTL of 2 s or 10 s: the fallback
// goes on from where the allocator left off, and what it admits stays
// within its bound (the fleet at most C + ρ·t in a window of t). (None of
// 200 such fleets refused; a 60 RPM key spread over 2 to 6 gateways, a
// request every 5 to 25 s each, did in 4 to 6 of 80: docs/contract.md.)
func TestLeasedOutageKeepsAKeyBelowItsLimit(t *testing.T) {
	for seed := range uint64(12) {
		rng := rand.New(rand.NewPCG(seed, 25))
		n := 1 + rng.IntN(6)
		lim := ration.Limits{RPM: []int64{600, 3000}[rng.IntN(2)]}
		ttl := []time.Duration{2 * time.Second, 10 * time.Second}[rng.IntN(2)]
		load := 0.1 + 0.4*rng.Float64() // of the limit
		cutAt := time.Duration(20+rng.IntN(20)) * time.Second
		cut := time.Duration(500+rng.IntN(14500)) * time.Millisecond
		name := fmt.Sprintf("seed %d: %d gateways, %v, TTL %v, %.0f%% of the limit, cut %v at %v", seed, n, lim, ttl, 100*load, cut, cutAt)
		t.Run(name, func(t *testing.T) {
			f := newFleetRig(t, n, ttl)
			rate := load * float64(lim.RPM) / 60 // a second
			c := ration.Amount{Requests: 1}
			start, refused := f.clk.Now(), 0
			var fbFirst, fbLast time.Time
			for at := time.Duration(0); at < cutAt+cut+2*ttl; {
				gap := time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
				f.advance(gap, 250*time.Millisecond)
				at += gap
				for _, g := range f.gws {
					g.cut = at >= cutAt && at < cutAt+cut
				}
				fb := f.fleetMetric("ration_spender_admitted_total", "path", "fallback")
				r, err := f.reserve(rng.IntN(n), "k", lim, c)
				if err != nil {
					refused++
					t.Errorf("at %v (%v into the cut): %v", at, at-cutAt, err)
					continue
				}
				r.Settle(c)
				if f.fleetMetric("ration_spender_admitted_total", "path", "fallback") > fb {
					if fbFirst.IsZero() {
						fbFirst = f.clk.Now()
					}
					fbLast = f.clk.Now()
				}
			}
			fallback := f.fleetMetric("ration_spender_admitted_total", "path", "fallback")
			span := fbLast.Sub(fbFirst)
			bound := float64(lim.RPM) + float64(lim.RPM)/60*span.Seconds()
			t.Logf("%d refused; %.0f fallback admissions over %v from %v (bound %.0f)", refused, fallback, span.Round(time.Millisecond),
				fbFirst.Sub(start).Round(time.Millisecond), bound)
			if fallback > bound {
				t.Errorf("%.0f fallback admissions in %v, above C + ρ·t = %.0f", fallback, span, bound)
			}
		})
	}
}

// refusedWhole is a LeaseSource that refuses every call as malformed, as an
// allocator does that rejects the call whole: the Limiter cannot be served.
type refusedWhole struct{ calls atomic.Int64 }

func (s *refusedWhole) Acquire(context.Context, *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	s.calls.Add(1)
	return nil, connect.NewError(connect.CodeInvalidArgument, "refused whole")
}

func (s *refusedWhole) ReserveAhead(context.Context, *leasev1.ReserveAheadRequest) (*leasev1.ReserveAheadResponse, error) {
	s.calls.Add(1)
	return nil, connect.NewError(connect.CodeInvalidArgument, "refused whole")
}

func (s *refusedWhole) Release(context.Context, *leasev1.ReleaseRequest) (*leasev1.ReleaseResponse, error) {
	return nil, connect.NewError(connect.CodeInvalidArgument, "refused whole")
}

// TestLeasedFallbackIsReported: a Limiter whose calls the allocator
// refuses admits by its fallback policy, and says so: Ready reports the
// allocator's refusal (a gateway's /readyz is 503 with it), the fallback
// gauge reads 1, and it does not ask again for each request (one call per
// look made thousands a second).
func TestLeasedFallbackIsReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clk bubbleClock
		src := &refusedWhole{}
		reg := prometheus.NewPedanticRegistry()
		m, err := spender.NewMetrics(reg)
		if err != nil {
			t.Fatal(err)
		}
		l := newLimiter(t, clk, spender.WithLeases(src), spender.WithMetrics(m), testTuning(50*time.Millisecond),
			spender.WithLogger(slog.New(slog.DiscardHandler)))
		defer l.Close(context.Background())
		lim := ration.Limits{RPM: 600}
		admitted := 0
		for range 100 {
			r, err := l.Reserve(t.Context(), "k", lim, ration.Amount{Requests: 1})
			if err == nil {
				admitted++
				if spender.AdmissionPath(r) != spender.PathFallback {
					t.Fatalf("admitted on path %v without an allocator", spender.AdmissionPath(r))
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		if admitted == 0 {
			t.Fatal("nothing admitted by the fallback policy")
		}
		if err := l.Ready(); !errors.Is(err, spender.ErrAllocatorUnreachable) || !strings.Contains(err.Error(), "refused whole") {
			t.Errorf("Ready = %v, want ErrAllocatorUnreachable with the allocator's refusal", err)
		}
		if g := metricOf(t, reg, "ration_spender_fallback"); g != 1 {
			t.Errorf("ration_spender_fallback = %v while admitting by the fallback policy, want 1", g)
		}
		if n := src.calls.Load(); n > 10 {
			t.Errorf("%d calls for 100 requests in a second, want a few (a call per maintenance at most)", n)
		}
	})
}
