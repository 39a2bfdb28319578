package engine

import (
	"fmt"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/leasewire"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// central asks the allocator about every request: one Acquire with
// want = need = the request's cost through the simulated network, from a
// pool of connection slots per instance (each slot is a caller with its
// own exactly-once session, since a caller may have only one call in
// flight). While the request runs, the slot renews its holding every half
// TTL (a holding the allocator saw expire could not take the refund); at
// settlement it makes one more call returning the unused part and the
// holding. The allocator runs strict, so this is the exact global bucket,
// one round trip away.
//
// A request not decided within the slow-path deadline (a lost message, an
// outage) is rejected: central fails closed, and its slot gives the call
// up, as a client cancelling its RPC would. If the allocator applied it
// anyway, the grant stays held until the TTL (stranded budget).
type central struct {
	free [][]int32 // idle slots by instance
}

func (c *central) join(s *sim, i int32) {
	for len(c.free) < len(s.insts) {
		c.free = append(c.free, nil)
	}
}

func (*central) leave(*sim, int32)   {}
func (*central) drained(*sim, int32) {}
func (*central) tick(*sim)           {}
func (*central) finish(*sim)         {}
func (*central) failed(*sim, int32)  {}

// refused cannot happen for the bodies central builds; it ends the call
// as if nothing was granted.
func (c *central) refused(s *sim, ep int32) {
	c.answered(s, ep, reply{resp: &leasev1.AcquireResponse{Keys: make([]*leasev1.KeyGrant, s.eps[ep].nb)}})
}

func (c *central) slot(s *sim, i int32) int32 {
	if n := len(c.free[i]); n > 0 {
		ep := c.free[i][n-1]
		c.free[i] = c.free[i][:n-1]
		return ep
	}
	return s.newEndpoint(i)
}

// part is one budget's entry in a central call: want (and need) on top of
// held, after giving back returned and reporting debt.
type part struct{ want, returned, debt, held ration.Amount }

// call starts ep's next call, with one entry per budget of the slot's
// request.
func (c *central) call(s *sim, ep int32, parts []part) {
	e := s.eps[ep]
	e.seq++
	keys := make([]*leasev1.KeyAcquire, len(parts))
	for i, p := range parts {
		b := &s.budgets[e.bud[i]]
		lim := b.lim
		keys[i] = &leasev1.KeyAcquire{
			Key:    b.name,
			Limits: leasewire.NewLimits(lim),
			Want:   leasewire.NewAmount(p.want), Need: leasewire.NewAmount(p.want), Returned: leasewire.NewAmount(p.returned),
			Debt: leasewire.NewAmount(p.debt), Held: leasewire.NewAmount(p.held),
		}
	}
	s.begin(ep, &leasev1.AcquireRequest{
		Caller: &leasev1.Caller{SpenderId: fmt.Sprintf("central-%d", ep), Epoch: 1, Sequence: e.seq},
		Keys:   keys,
	})
}

func (c *central) arrive(s *sim, id int32) {
	r := &s.reqs[id]
	ep := c.slot(s, r.inst)
	e := s.eps[ep]
	e.req, e.phase, e.settled, e.nb = id, deciding, false, r.nch
	var ps [maxCharges]part
	for i, ch := range r.charges() {
		e.bud[i] = ch.b
		ps[i].want = limited(s.budgets[ch.b].lim, ch.cost)
	}
	r.ep, r.parked = ep, true
	s.q.push(event{at: s.at(s.cfg.SlowDeadline), kind: evParkDeadline, b: id})
	c.call(s, ep, ps[:e.nb])
}

// parkDeadline rejects a request still undecided (fail closed) and frees
// its slot; a late reply to the abandoned call is ignored.
func (c *central) parkDeadline(s *sim, id int32) {
	ep := s.reqs[id].ep
	e := s.eps[ep]
	e.body, e.phase, e.req = nil, idle, -1
	c.free[e.inst] = append(c.free[e.inst], ep)
	s.reject(id, &spender.RejectError{}) // no answer: no wait to name
}

func (c *central) answered(s *sim, ep int32, g reply) {
	e := s.eps[ep]
	e.body = nil
	switch e.phase {
	case deciding:
		id := e.req
		r := &s.reqs[id]
		var granted [maxCharges]ration.Amount
		all, some := true, false
		var wait time.Duration // the longest wait an uncovered budget names
		for i := range e.nb {
			if k := g.resp.GetKeys()[i]; k.GetStatus() == leasev1.GrantStatus_GRANT_STATUS_OK {
				granted[i], some = limited(s.budgets[e.bud[i]].lim, r.ch[i].cost), true
			} else {
				all = false
				wait = max(wait, time.Duration(k.GetRetryAfterUs())*time.Microsecond)
			}
		}
		if all {
			e.phase, e.hold = holding, granted
			e.holdGen++
			res := &centralRes{c: c, s: s, ep: ep, gen: e.holdGen}
			if r.nch == 1 {
				s.admit(id, res)
			} else {
				s.admitAll(id, centralAll{res})
			}
			c.scheduleRenew(s, ep)
			return
		}
		e.req = -1
		s.reject(id, &spender.RejectError{RetryAfter: wait})
		if some {
			// All or nothing: what the budgets that covered the request
			// granted goes back at once.
			var ps [maxCharges]part
			for i := range e.nb {
				ps[i].returned = granted[i]
			}
			e.phase = settling
			c.call(s, ep, ps[:e.nb])
			return
		}
	case holding: // a renewal came back
		if e.settled {
			c.sendSettle(s, ep)
			return
		}
		c.scheduleRenew(s, ep)
		return
	}
	e.phase, e.req, e.hold = idle, -1, [maxCharges]ration.Amount{}
	c.free[e.inst] = append(c.free[e.inst], ep)
}

func (c *central) scheduleRenew(s *sim, ep int32) {
	s.q.push(event{at: s.at(s.cfg.TTL / 2), kind: evRenew, a: ep, g: s.eps[ep].holdGen})
}

// renew keeps slot ep's holding alive while its request runs.
func (c *central) renew(s *sim, ep int32, gen uint32) {
	e := s.eps[ep]
	if e.phase != holding || e.holdGen != gen || e.body != nil || e.settled {
		return
	}
	var ps [maxCharges]part
	for i := range e.nb {
		ps[i].held = e.hold[i]
	}
	c.call(s, ep, ps[:e.nb])
}

// sendSettle returns the unused part of the slot's holding (or reports the
// overrun) and lets the holding go.
func (c *central) sendSettle(s *sim, ep int32) {
	e := s.eps[ep]
	var ps [maxCharges]part
	for i := range e.nb {
		a, h := limited(s.budgets[e.bud[i]].lim, e.settle[i]), e.hold[i]
		ps[i].returned = ration.Amount{Requests: max(0, h.Requests-a.Requests), Tokens: max(0, h.Tokens-a.Tokens)}
		ps[i].debt = ration.Amount{Requests: max(0, a.Requests-h.Requests), Tokens: max(0, a.Tokens-h.Tokens)}
	}
	e.phase, e.req, e.settled = settling, -1, false
	c.call(s, ep, ps[:e.nb])
}

// centralRes is a central admission: settling it starts the slot's last
// call (after a renewal in flight, if any).
type centralRes struct {
	c    *central
	s    *sim
	ep   int32
	gen  uint32
	done bool
}

func (r *centralRes) Settle(actual ration.Amount) { r.settleAll([]ration.Amount{actual}) }

func (r *centralRes) settleAll(actual []ration.Amount) {
	e := r.s.eps[r.ep]
	if r.done || e.holdGen != r.gen || e.phase != holding {
		return
	}
	r.done = true
	copy(e.settle[:], actual)
	e.settled = true
	if e.body == nil {
		r.c.sendSettle(r.s, r.ep)
	}
}

func (r *centralRes) Cancel()                { r.Settle(ration.Amount{}) }
func (r *centralRes) Status() spender.Status { return spender.Status{} }

// centralAll is a central admission of a request charged to several
// budgets.
type centralAll struct{ r *centralRes }

func (a centralAll) Settle(actual []ration.Amount) error {
	a.r.settleAll(actual)
	return nil
}

// limited zeroes the dimensions lim leaves unlimited.
func limited(lim ration.Limits, c ration.Amount) ration.Amount {
	if lim.RPM == 0 {
		c.Requests = 0
	}
	if lim.TPM == 0 {
		c.Tokens = 0
	}
	return c
}
