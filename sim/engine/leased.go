package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rationhq/ration/allocator"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// leased is ration: a leased spender.Limiter per instance, built with
// manual leasing so that its allocator calls travel the simulated network
// and its clock is the virtual one.
//
// A request whose lease cannot cover it (ErrLeasePending) is parked until
// its spender's call is answered or fails, or until a slow-path deadline
// has passed, and then asked again; the time parked is its added latency.
type leased struct{}

func (leased) join(s *sim, i int32) {
	in := &s.insts[i]
	in.reg = prometheus.NewRegistry()
	m, err := spender.NewMetrics(in.reg)
	if err != nil {
		panic(err) // a fresh registry cannot hold a duplicate
	}
	in.lim = spender.New(s.clk,
		spender.WithShards(1), // one key: one shard keeps Maintain cheap
		spender.WithLeases(&releaseTap{svc: s.svc, s: s}),
		spender.WithManualLeasing(),
		spender.WithSpenderID(fmt.Sprintf("gw-%d", i)),
		spender.WithEpoch(1),
		spender.WithSlowPathDeadline(s.cfg.SlowDeadline),
		spender.WithLeaseHorizon(s.cfg.Horizon),
		spender.WithMaintenanceInterval(s.cfg.Tick),
		spender.WithFallback(s.cfg.Fallback),
		spender.WithMetrics(m),
	)
	in.ep = s.newEndpoint(i)
}

func (leased) leave(*sim, int32) {}

// drained closes the instance's spender: its Release (unspent leases and
// debts) goes straight to the allocator, not over the simulated network.
// An instance that cannot reach the allocator just stops; its leases
// expire.
func (leased) drained(s *sim, i int32) {
	in := &s.insts[i]
	s.col.fallback += fallbackAdmits(in.reg)
	if s.down(s.now) {
		return
	}
	if err := in.lim.Close(s.ctx); err != nil {
		s.col.allocErrors++
	}
}

func (l leased) arrive(s *sim, id int32) {
	r := &s.reqs[id]
	l.try(s, id)
	if r.parked {
		s.insts[r.inst].parked = append(s.insts[r.inst].parked, id)
	}
	l.pump(s, r.inst)
}

// try asks the spender for request id and records the outcome; it leaves
// the request parked (with a deadline) if the lease is pending.
func (leased) try(s *sim, id int32) {
	r := &s.reqs[id]
	res, err := s.insts[r.inst].lim.Reserve(s.ctx, key, s.cfg.Limits, r.cost)
	switch {
	case err == nil:
		s.admit(id, res)
	case errors.Is(err, spender.ErrLeasePending):
		if !r.parked {
			r.parked = true
			s.q.push(event{at: s.at(s.cfg.SlowDeadline), kind: evParkDeadline, b: id})
		}
	default:
		var rej *spender.RejectError
		if !errors.As(err, &rej) {
			panic(fmt.Sprintf("engine: leased Reserve: %v", err))
		}
		s.reject(id)
	}
}

func (l leased) parkDeadline(s *sim, id int32) {
	r := &s.reqs[id]
	in := r.inst
	r.parked = false // asked again below; parked anew with a new deadline if still pending
	l.try(s, id)
	if r.parked {
		return // still in the instance's list
	}
	list := s.insts[in].parked
	for k, p := range list {
		if p == id {
			s.insts[in].parked = append(list[:k], list[k+1:]...)
			break
		}
	}
	l.pump(s, in)
}

// retryParked asks again for every request parked on instance i, in
// arrival order.
func (l leased) retryParked(s *sim, i int32) {
	in := &s.insts[i]
	list := in.parked
	in.parked = nil
	keep := list[:0]
	for _, id := range list {
		r := &s.reqs[id]
		if !r.parked || r.inst != i {
			continue // decided by its deadline meanwhile
		}
		l.try(s, id)
		if r.parked {
			keep = append(keep, id)
		}
	}
	in.parked = append(keep, in.parked...)
}

// pump sends the spender's next call if none is outstanding.
func (leased) pump(s *sim, i int32) {
	in := &s.insts[i]
	if in.call != nil || in.closed {
		return
	}
	if c := in.lim.NextCall(); c != nil {
		in.call = c
		s.begin(in.ep, c.Request())
	}
}

func (l leased) answered(s *sim, ep int32, g reply) {
	e := s.eps[ep]
	in := &s.insts[e.inst]
	in.lim.Deliver(in.call, g.resp, nil)
	in.call, e.body = nil, nil
	l.retryParked(s, e.inst)
	l.pump(s, e.inst)
}

// refused gives up a call the allocator rejected as invalid, as the real
// leaser does: no answer is applied and the spender does not count the
// allocator as unreachable; the keys are asked for again on the next call.
func (l leased) refused(s *sim, ep int32) {
	e := s.eps[ep]
	in := &s.insts[e.inst]
	in.call, e.body = nil, nil
	l.retryParked(s, e.inst)
	l.pump(s, e.inst)
}

func (l leased) failed(s *sim, ep int32) {
	e := s.eps[ep]
	in := &s.insts[e.inst]
	in.lim.Deliver(in.call, nil, e.resp.err)
	l.retryParked(s, e.inst)
}

func (l leased) tick(s *sim) {
	for i := range s.insts {
		in := &s.insts[i]
		if in.joined && !in.closed {
			in.lim.Maintain()
			l.pump(s, int32(i))
		}
	}
}

// finish lets every remaining spender go as if it left.
func (l leased) finish(s *sim) {
	for i := range s.insts {
		in := &s.insts[i]
		if in.joined && !in.closed {
			in.closed = true
			l.drained(s, int32(i))
		}
	}
}

// releaseTap is the LeaseSource a leased spender holds. Under manual
// leasing only Close uses it (Acquire travels the simulated network); it
// records what Release gave back so stranded budget can be accounted.
type releaseTap struct {
	svc *allocator.Service
	s   *sim
}

func (t *releaseTap) Acquire(ctx context.Context, r *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	return t.svc.Acquire(ctx, r)
}

func (t *releaseTap) ReserveAhead(ctx context.Context, r *leasev1.ReserveAheadRequest) (*leasev1.ReserveAheadResponse, error) {
	return t.svc.ReserveAhead(ctx, r)
}

func (t *releaseTap) Release(ctx context.Context, r *leasev1.ReleaseRequest) (*leasev1.ReleaseResponse, error) {
	resp, err := t.svc.Release(ctx, r)
	if err == nil {
		c := &t.s.col
		for i, k := range r.GetKeys() {
			c.debt += c.amount(k.GetDebt())
			c.returned += c.amount(resp.GetReturned()[i])
		}
	}
	return resp, err
}

// fallbackAdmits reads admitted_total{path="fallback"} from a spender's
// registry.
func fallbackAdmits(reg *prometheus.Registry) int64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != "ration_spender_admitted_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "path" && lp.GetValue() == "fallback" {
					return int64(m.GetCounter().GetValue())
				}
			}
		}
	}
	return 0
}
