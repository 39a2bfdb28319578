package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// leased is ration: a leased spender.Limiter per instance, whose lease
// state machine the simulator moves itself (spender.DrivingSource): the
// very machine a gateway's Limiter runs, with its calls carried over the
// simulated network and its time the virtual clock.
//
// A request whose lease cannot cover it is parked until its spender's call
// is answered or fails, or until the machine's slow-path deadline has
// passed, and then asked again; the time parked is its added latency.
type leased struct{}

func (leased) join(s *sim, i int32) {
	in := &s.insts[i]
	in.ep = s.newEndpoint(i)
	tap := &releaseTap{s: s, ep: in.ep}
	in.lim = mustLimiter(s.clk,
		spender.WithShards(1), // a few keys: one shard keeps maintenance cheap
		spender.WithLeases(tap),
		spender.WithSpenderID(fmt.Sprintf("gw-%d", i)),
		spender.WithEpoch(1),
		spender.WithLeaseTuning(s.cfg.leaseTuning()),
		spender.WithFallback(s.cfg.Fallback),
		spender.WithLogger(slog.New(slog.DiscardHandler)), // (the default, slog.Default(), would print every instance's outage)
	)
	in.m = tap.m
}

func (leased) leave(*sim, int32) {}

// drained closes the instance's spender: its Release (unspent leases and
// debts) goes straight to the allocator, not over the simulated network.
// An instance that cannot reach the allocator just stops; its leases
// expire.
func (leased) drained(s *sim, i int32) {
	in := &s.insts[i]
	n := in.m.Counts()
	s.col.fallback += n.FallbackAdmissions
	s.col.accrued = s.col.accrued.Add(n.ShareAccrued)
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

// try asks the spender's machine for request id and records the outcome;
// it leaves the request parked (with the machine's deadline) if the
// allocator must be asked first.
func (leased) try(s *sim, id int32) {
	r := &s.reqs[id]
	m := s.insts[r.inst].m
	var res spender.Reservation
	var all *spender.Reservations
	var w *spender.Wait
	var err error
	if r.nch == 1 {
		b := &s.budgets[r.ch[0].b]
		res, _, w, err = m.Reserve(b.name, b.lim, r.ch[0].cost, 0, false, r.wait)
	} else {
		all, w, err = m.ReserveAll(s.chargesOf(r), r.wait)
	}
	switch {
	case w != nil:
		if !r.parked {
			r.parked = true
			s.q.push(event{at: s.instant(w.Deadline()), kind: evParkDeadline, b: id})
		}
		r.wait = w
	case err == nil && r.nch == 1:
		r.wait = nil
		s.admit(id, res)
	case err == nil:
		r.wait = nil
		s.admitAll(id, all)
	default:
		var rej *spender.RejectError
		if !errors.As(err, &rej) {
			panic(fmt.Sprintf("engine: leased Reserve: %v", err))
		}
		r.wait = nil
		s.reject(id, rej)
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

// pump sends the machine's next call if it has one, and otherwise wakes
// the instance again when the machine says it next needs to run.
func (leased) pump(s *sim, i int32) {
	in := &s.insts[i]
	if in.closed || s.eps[in.ep].body != nil {
		return
	}
	if c := in.m.NextCall(); c != nil {
		in.call = c
		e := s.eps[in.ep]
		e.timeout = int64(in.m.AttemptTimeout() / time.Microsecond)
		s.begin(in.ep, c.Acquire()) // the sim has no wait mode: only Acquire
		return
	}
	at := max(s.instant(in.m.NextWake()), s.now+1)
	if in.wakeAt <= s.now || at < in.wakeAt {
		in.wakeAt = at
		s.q.push(event{at: at, kind: evWake, a: i})
	}
}

// wake runs instance i's machine at a time it asked for.
func (l leased) wake(s *sim, i int32) {
	in := &s.insts[i]
	if !in.joined || in.closed || s.now < in.wakeAt {
		return // a later wake was scheduled since
	}
	in.wakeAt = 0
	in.m.Tick()
	l.pump(s, i)
}

func (l leased) answered(s *sim, ep int32, g reply) {
	e := s.eps[ep]
	in := &s.insts[e.inst]
	in.m.Deliver(in.call, g.resp, nil)
	in.call, e.body = nil, nil
	l.retryParked(s, e.inst)
	l.pump(s, e.inst)
}

// refused hands the machine the allocator's rejection of a call as
// invalid: it gives the call up, as it would in a gateway.
func (l leased) refused(s *sim, ep int32) {
	e := s.eps[ep]
	in := &s.insts[e.inst]
	in.m.Deliver(in.call, nil, e.resp.err)
	in.call, e.body = nil, nil
	l.retryParked(s, e.inst)
	l.pump(s, e.inst)
}

// failed hands the machine a failed attempt; the machine decides when to
// send the call again (pump asks it at its next wake).
func (l leased) failed(s *sim, ep int32) {
	e := s.eps[ep]
	in := &s.insts[e.inst]
	in.m.Deliver(in.call, nil, e.resp.err)
	e.body = nil // resent through NextCall, not the network's own backoff
	l.retryParked(s, e.inst)
	l.pump(s, e.inst)
}

func (l leased) tick(s *sim) {
	for i := range s.insts {
		in := &s.insts[i]
		if in.joined && !in.closed {
			in.m.Tick()
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

// releaseTap is the LeaseSource a leased spender holds. It takes the
// spender's machine (Drive), whose calls travel the simulated network; only
// Close uses the methods below. It records what Release gave back so
// stranded budget can be accounted, and counts the key entries the
// allocator answers as the network path does.
type releaseTap struct {
	s  *sim
	ep int32 // the spender's endpoint
	m  *spender.Machine
}

var _ spender.DrivingSource = (*releaseTap)(nil)

// Drive keeps the machine for the simulator to move.
func (t *releaseTap) Drive(m *spender.Machine) { t.m = m }

func (t *releaseTap) Acquire(ctx context.Context, r *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	resp, err := t.s.src.Acquire(ctx, r)
	if err == nil {
		t.s.col.onAnswered(t.s, len(resp.GetKeys()))
	}
	return resp, err
}

func (t *releaseTap) ReserveAhead(ctx context.Context, r *leasev1.ReserveAheadRequest) (*leasev1.ReserveAheadResponse, error) {
	resp, err := t.s.src.ReserveAhead(ctx, r)
	if err == nil {
		t.s.col.onAnswered(t.s, len(resp.GetKeys()))
	}
	return resp, err
}

func (t *releaseTap) Release(ctx context.Context, r *leasev1.ReleaseRequest) (*leasev1.ReleaseResponse, error) {
	resp, err := t.s.src.Release(ctx, r)
	if err == nil {
		c := &t.s.col
		c.onReleased(t.ep)
		for i, k := range r.GetKeys() {
			b := &c.bud[t.s.budgetOf[k.GetKey()]]
			b.debt += b.amount(k.GetDebt())
			b.returned += b.amount(resp.GetReturned()[i])
		}
	}
	return resp, err
}
