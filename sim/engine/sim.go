package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/spender"
)

// key is the one API key a one-key run limits.
const key = "sim-key"

// instance is one gateway of the fleet.
type instance struct {
	live    bool // receiving traffic
	joined  bool // ever joined
	leaving bool // left: drains its in-flight requests, then closes
	closed  bool

	lim      *spender.Limiter   // standalone (static, sticky) or leased
	ep       int32              // leased: its endpoint
	m        *spender.Machine   // leased: the spender's lease state machine
	call     *spender.LeaseCall // leased: the call being sent
	wakeAt   int64              // leased: when the machine's next wake is scheduled, virtual µs
	parked   []int32            // leased: requests waiting on the call
	inflight int                // admitted and not yet settled, plus parked
}

// sim is one run: the virtual clock, the event queue and every component.
// It is single-threaded; the real spender and allocator code it drives
// take their locks as usual.
type sim struct {
	cfg   Config
	ctx   context.Context
	clk   *fakeclock.Clock
	start time.Time
	now   int64 // virtual µs since start
	end   int64 // last arrival instant
	stop  int64 // events after this are not run

	q     queue
	tr    *traffic
	nrng  *rand.Rand // network randomness, its own stream
	crng  *rand.Rand // the client's requests and routing, its own stream
	retry request    // what the client sends again (evClient with a = 1)
	insts []instance
	live  []int32 // live instances in index order
	reqs  []request
	free  []int32
	eps   []*endpoint

	budgets  []budget         // what requests are charged to; one for a one-key run
	primary  int              // the budget the headline numbers are in
	budgetOf map[string]int32 // budget index by key
	charges  [maxCharges]spender.Charge
	actuals  [maxCharges]ration.Amount

	strat  strategy
	ledger *allocator.Ledger
	svc    *allocator.Service
	src    spender.LeaseSource // svc as every allocator call reaches it (wrapped in tests)
	shadow *spender.Limiter    // the ideal: one exact bucket, every arrival, no network

	outFrom, outTo int64 // allocator outage, virtual µs

	col collector
}

// strategy is what differs between the compared strategies. Every method
// runs on the simulation goroutine at the current virtual time.
type strategy interface {
	join(s *sim, i int32)
	leave(s *sim, i int32)
	arrive(s *sim, id int32)
	parkDeadline(s *sim, id int32)
	answered(s *sim, ep int32, g reply)
	failed(s *sim, ep int32)
	refused(s *sim, ep int32)
	tick(s *sim)
	drained(s *sim, i int32)
	finish(s *sim)
}

// Run simulates one scenario under one strategy and returns what it
// measured. The same Config (seed included) always gives the same Result.
func Run(cfg Config) (*Result, error) {
	cfg = cfg.withDefaults()
	if cfg.Scenario.Clusters != nil {
		return runClusters(cfg)
	}
	s, err := newSim(cfg)
	if err != nil {
		return nil, err
	}
	s.loop()
	return s.result(), nil
}

func newSim(cfg Config) (*sim, error) {
	lims := cfg.Limits
	if cfg.Scenario.Tokens && lims.TPM == 0 || !cfg.Scenario.Tokens && lims.RPM == 0 {
		return nil, fmt.Errorf("engine: scenario %s is bound by %v, but limits %+v leave it unlimited", cfg.Scenario.Name, cfg.Scenario.Dim(), lims)
	}
	if err := cfg.leaseTuning().Validate(); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	clk := fakeclock.New()
	bs, primary := cfg.Scenario.budgets(lims)
	for _, b := range bs {
		if err := b.lim.Validate(); err != nil {
			return nil, fmt.Errorf("engine: scenario %s, budget %s: %w", cfg.Scenario.Name, b.name, err)
		}
	}
	s := &sim{
		cfg:      cfg,
		ctx:      context.Background(),
		clk:      clk,
		start:    clk.Now(),
		end:      int64(cfg.Duration / time.Microsecond),
		tr:       newTraffic(cfg, primary),
		nrng:     rand.New(rand.NewPCG(cfg.Seed, 2)),
		crng:     rand.New(rand.NewPCG(cfg.Seed, 3)),
		insts:    make([]instance, cfg.Instances),
		budgets:  bs,
		primary:  primary,
		budgetOf: make(map[string]int32, len(bs)),
	}
	for i, b := range bs {
		s.budgetOf[b.name] = int32(i)
	}
	// The drain: a TTL, a horizon and 5 s after the last arrival, and at
	// least until a TTL after the last request admitted (within the
	// slow-path deadline of its arrival) could end, so that every
	// gateway's idle check runs.
	drain := max(cfg.TTL+cfg.Horizon+5*time.Second, cfg.SlowDeadline+s.tr.longest()+cfg.TTL)
	s.stop = s.end + int64(drain/time.Microsecond)
	s.outFrom, s.outTo = cfg.Scenario.outage(cfg.Duration)
	s.shadow = mustLimiter(clk, spender.WithShards(1))
	s.col.init(s)

	switch cfg.Strategy {
	case Static:
		s.strat = &standalone{}
	case Sticky:
		s.strat = &standalone{sticky: true}
	case Central:
		s.strat = &central{}
	case Leased, LeasedStrict:
		s.strat = &leased{}
	default:
		return nil, fmt.Errorf("engine: unknown strategy %q", cfg.Strategy)
	}
	if cfg.Strategy != Static && cfg.Strategy != Sticky {
		opts := []allocator.Option{allocator.WithClock(clk), allocator.WithTTL(cfg.TTL),
			allocator.WithStrict(cfg.Strategy != Leased)}
		if cfg.Policy != nil {
			opts = append(opts, allocator.WithPolicy(cfg.Policy))
		}
		led, err := allocator.New(opts...)
		if err != nil {
			return nil, err
		}
		s.ledger, s.svc = led, allocator.NewService(led)
		s.src = s.svc
		if cfg.wrapSource != nil {
			s.src = cfg.wrapSource(s.svc)
		}
	}

	initial, joins, leaves := cfg.Scenario.membership(cfg.Instances, cfg.Duration)
	for i := range initial {
		s.join(int32(i))
	}
	for j, at := range joins {
		s.q.push(event{at: at, kind: evJoin, a: int32(initial + j)})
	}
	for j, at := range leaves {
		s.q.push(event{at: at, kind: evLeave, a: int32(initial + j)})
	}
	if cfg.Scenario.Loaded() {
		s.q.push(event{at: s.tr.next(0), kind: evArrival})
	}
	if cfg.Scenario.Client != NoClient {
		s.q.push(event{at: 0, kind: evClient})
	}
	s.q.push(event{at: int64(cfg.SeriesStep / time.Microsecond), kind: evSample})
	if _, ok := s.strat.(*leased); ok {
		s.q.push(event{at: int64(cfg.Tick / time.Microsecond), kind: evTick})
	}
	return s, nil
}

// mustLimiter is spender.New for options the configuration has already
// checked (newSim validates the lease tuning).
func mustLimiter(clk *fakeclock.Clock, opts ...spender.Option) *spender.Limiter {
	l, err := spender.New(clk, opts...)
	if err != nil {
		panic(fmt.Sprintf("engine: %v", err)) // unreachable: the options were validated
	}
	return l
}

// leaseTuning is the leased spenders' timing: the spender's defaults with
// the configured deadline, horizon and maintenance interval.
func (c Config) leaseTuning() spender.LeaseTuning {
	t := spender.DefaultLeaseTuning()
	t.SlowPathDeadline, t.Horizon, t.MaintenanceInterval = c.SlowDeadline, c.Horizon, c.Tick
	return t
}

// setNow moves the virtual clock (and the shared fake clock) to t.
func (s *sim) setNow(t int64) {
	if t != s.now {
		s.now = t
		s.clk.Set(s.start.Add(time.Duration(t) * time.Microsecond))
	}
}

func (s *sim) at(d time.Duration) int64 { return s.now + int64(d/time.Microsecond) }

// instant is the virtual µs of clock time t.
func (s *sim) instant(t time.Time) int64 { return int64(t.Sub(s.start) / time.Microsecond) }

// loop runs events in time order until none are left or the drain ends.
func (s *sim) loop() {
	total := time.Duration(s.stop) * time.Microsecond
	step := max(s.stop/200, 1)
	nextReport := step
	for s.q.len() > 0 && s.q.peek() <= s.stop {
		e := s.q.pop()
		s.setNow(e.at)
		if s.cfg.Progress != nil && s.now >= nextReport {
			s.cfg.Progress(time.Duration(s.now)*time.Microsecond, total)
			nextReport = s.now + step
		}
		s.dispatch(e)
	}
	s.setNow(s.stop)
	s.strat.finish(s)
	if s.cfg.Progress != nil {
		s.cfg.Progress(total, total)
	}
}

func (s *sim) dispatch(e event) {
	switch e.kind {
	case evArrival:
		s.arrival()
	case evSettle:
		s.settle(e.b)
	case evShadowSettle:
		r := &s.reqs[e.b]
		if r.shadowAll != nil {
			r.shadowAll.Settle(s.actualsOf(r))
			r.shadowAll = nil
		} else {
			r.shadow.Settle(r.ch[0].actual)
			r.shadow = nil
		}
		s.release(e.b)
	case evParkDeadline:
		if s.reqs[e.b].parked {
			s.strat.parkDeadline(s, e.b)
		}
	case evNetArrive:
		s.netArrive(e.a, e.g)
	case evNetReply:
		s.netReply(e.a, e.g)
	case evNetFail:
		s.netFail(e.a, e.g)
	case evNetResend:
		s.netResend(e.a, e.g)
	case evWake:
		if l, ok := s.strat.(*leased); ok {
			l.wake(s, e.a)
		}
	case evTick:
		s.strat.tick(s)
		if s.now < s.stop {
			s.q.push(event{at: s.at(s.cfg.Tick), kind: evTick})
		}
	case evSample:
		s.col.sample(s)
		if s.now < s.end {
			s.q.push(event{at: s.at(s.cfg.SeriesStep), kind: evSample})
		}
	case evRenew:
		if c, ok := s.strat.(*central); ok {
			c.renew(s, e.a, e.g)
		}
	case evJoin:
		s.join(e.a)
	case evLeave:
		s.leave(e.a)
	case evClient:
		s.clientSends(e.a == 1)
	case evIdle:
		s.idleCheck(e.a)
	}
}

func (s *sim) join(i int32) {
	s.insts[i].live, s.insts[i].joined = true, true
	s.live = s.live[:0]
	for k := range s.insts {
		if s.insts[k].live {
			s.live = append(s.live, int32(k))
		}
	}
	s.strat.join(s, i)
}

func (s *sim) leave(i int32) {
	in := &s.insts[i]
	in.live, in.leaving = false, true
	s.live = s.live[:0]
	for k := range s.insts {
		if s.insts[k].live {
			s.live = append(s.live, int32(k))
		}
	}
	s.strat.leave(s, i)
	s.checkDrained(i)
}

// checkDrained closes a leaving instance once nothing is in flight on it.
func (s *sim) checkDrained(i int32) {
	in := &s.insts[i]
	if in.leaving && !in.closed && in.inflight == 0 {
		in.closed = true
		s.strat.drained(s, i)
	}
}

// alloc returns a free request slot.
func (s *sim) alloc() int32 {
	if n := len(s.free); n > 0 {
		id := s.free[n-1]
		s.free = s.free[:n-1]
		return id
	}
	s.reqs = append(s.reqs, request{})
	return int32(len(s.reqs) - 1)
}

// release frees a request's slot once neither the strategy nor the ideal
// bucket holds it.
func (s *sim) release(id int32) {
	r := &s.reqs[id]
	if r.decided && r.res == nil && r.all == nil && r.shadow == nil && r.shadowAll == nil {
		s.free = append(s.free, id)
		r.decided = false
		r.origin = -1
	}
}

// arrival offers the traffic's next request and schedules the one after.
func (s *sim) arrival() {
	id := s.alloc()
	s.tr.fill(&s.reqs[id], s.now, s.live)
	s.offer(id)
	if next := s.tr.next(s.now); next < s.end {
		s.q.push(event{at: next, kind: evArrival})
	}
	s.release(id)
}

// offer offers request id, drawn and routed, to the ideal bucket and to
// the strategy.
func (s *sim) offer(id int32) {
	r := &s.reqs[id]
	s.col.onOffer(s, r)
	r.idealWait = 0
	var err error
	if r.nch == 1 {
		b := &s.budgets[r.ch[0].b]
		r.shadow, err = s.shadow.Reserve(s.ctx, b.name, b.lim, r.ch[0].cost)
	} else {
		r.shadowAll, err = s.shadow.ReserveAll(s.ctx, s.chargesOf(r))
	}
	if err != nil {
		r.idealWait = rejectWait(err)
	} else {
		s.col.onIdeal(s, r)
		s.q.push(event{at: s.now + r.service, kind: evShadowSettle, b: id})
	}
	if st, ok := s.strat.(*standalone); ok && st.sticky {
		r.inst = st.owner(s, r.key)
	}
	s.insts[r.inst].inflight++
	s.strat.arrive(s, id)
}

// admit records request id, charged to one budget, as admitted with res
// and schedules its settlement.
func (s *sim) admit(id int32, res spender.Reservation) {
	r := &s.reqs[id]
	r.res, r.decided, r.parked = res, true, false
	if isFallback(res) {
		r.fb = 1
	}
	s.col.onAdmit(s, r)
	s.q.push(event{at: s.now + r.service, kind: evSettle, b: id})
}

// admitAll records request id, charged to several budgets, as admitted
// with all and schedules its settlement.
func (s *sim) admitAll(id int32, all multiRes) {
	r := &s.reqs[id]
	r.all, r.decided, r.parked = all, true, false
	if rs, ok := all.(*spender.Reservations); ok {
		for i := range rs.Len() {
			if isFallback(rs.Part(i)) {
				r.fb |= 1 << i
			}
		}
	}
	s.col.onAdmit(s, r)
	s.q.push(event{at: s.now + r.service, kind: evSettle, b: id})
}

// chargesOf returns r's charges as spender.Charges (in a buffer reused by
// the next call).
func (s *sim) chargesOf(r *request) []spender.Charge {
	cs := s.charges[:r.nch]
	for i, c := range r.charges() {
		b := &s.budgets[c.b]
		cs[i] = spender.Charge{Key: b.name, Limits: b.lim, Cost: c.cost}
	}
	return cs
}

// actualsOf returns r's actual usage per charge (in a buffer reused by the
// next call).
func (s *sim) actualsOf(r *request) []ration.Amount {
	as := s.actuals[:r.nch]
	for i, c := range r.charges() {
		as[i] = c.actual
	}
	return as
}

// reject records request id as refused with rej (what its client is
// told), and sends the client's request again when rej says.
func (s *sim) reject(id int32, rej *spender.RejectError) {
	s.told(id, rej)
	r := &s.reqs[id]
	r.decided, r.parked = true, false
	s.col.onReject(s, r)
	s.insts[r.inst].inflight--
	s.ended(r.inst)
	s.checkDrained(r.inst)
	s.release(id)
}

func (s *sim) settle(id int32) {
	r := &s.reqs[id]
	switch {
	case s.cfg.leak:
		// The gateway forgets the reservation (tests: a holding the idle
		// check must catch).
	case r.all != nil:
		if err := r.all.Settle(s.actualsOf(r)); err != nil {
			panic(fmt.Sprintf("engine: settling: %v", err)) // one actual per charge, always
		}
	default:
		r.res.Settle(r.ch[0].actual)
	}
	r.res, r.all = nil, nil
	s.col.onSettle(s, r)
	if r.client && s.now < s.end {
		s.q.push(event{at: s.now, kind: evClient}) // its next request
	}
	s.insts[r.inst].inflight--
	s.ended(r.inst)
	s.checkDrained(r.inst)
	s.release(id)
}

// down reports whether the allocator is unreachable at t.
func (s *sim) down(t int64) bool { return t >= s.outFrom && t < s.outTo }
