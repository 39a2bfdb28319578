package engine

import (
	"fmt"
	"time"

	"github.com/rationhq/ration"
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
	c.answered(s, ep, reply{resp: &leasev1.AcquireResponse{Keys: []*leasev1.KeyGrant{{}}}})
}

func (c *central) slot(s *sim, i int32) int32 {
	if n := len(c.free[i]); n > 0 {
		ep := c.free[i][n-1]
		c.free[i] = c.free[i][:n-1]
		return ep
	}
	return s.newEndpoint(i)
}

// call starts ep's next call: want (and need) on top of held, after
// giving back returned and reporting debt.
func (c *central) call(s *sim, ep int32, want, returned, debt, held ration.Amount) {
	e := s.eps[ep]
	e.seq++
	amt := func(x ration.Amount) *leasev1.Amount {
		return &leasev1.Amount{Requests: x.Requests, Tokens: x.Tokens}
	}
	lim := s.cfg.Limits
	s.begin(ep, &leasev1.AcquireRequest{
		Caller: &leasev1.Caller{SpenderId: fmt.Sprintf("central-%d", ep), Epoch: 1, Sequence: e.seq},
		Keys: []*leasev1.KeyAcquire{{
			Key: key,
			Limits: &leasev1.Limits{Rpm: lim.RPM, Tpm: lim.TPM, BurstRequests: lim.BurstRequests, BurstTokens: lim.BurstTokens,
				WindowSeconds: uint32(lim.Window / time.Second)},
			Want: amt(want), Need: amt(want), Returned: amt(returned), Debt: amt(debt), Held: amt(held),
		}},
	})
}

func (c *central) arrive(s *sim, id int32) {
	r := &s.reqs[id]
	ep := c.slot(s, r.inst)
	e := s.eps[ep]
	e.req, e.phase, e.settle = id, deciding, nil
	r.ep, r.parked = ep, true
	s.q.push(event{at: s.at(s.cfg.SlowDeadline), kind: evParkDeadline, b: id})
	c.call(s, ep, limited(s.cfg.Limits, r.cost), ration.Amount{}, ration.Amount{}, ration.Amount{})
}

// parkDeadline rejects a request still undecided (fail closed) and frees
// its slot; a late reply to the abandoned call is ignored.
func (c *central) parkDeadline(s *sim, id int32) {
	ep := s.reqs[id].ep
	e := s.eps[ep]
	e.body, e.phase, e.req = nil, idle, -1
	c.free[e.inst] = append(c.free[e.inst], ep)
	s.reject(id)
}

func (c *central) answered(s *sim, ep int32, g reply) {
	e := s.eps[ep]
	e.body = nil
	switch e.phase {
	case deciding:
		kg := g.resp.GetKeys()[0]
		ok := kg.GetStatus() == leasev1.GrantStatus_GRANT_STATUS_OK
		id := e.req
		if ok {
			e.phase, e.hold = holding, limited(s.cfg.Limits, s.reqs[id].cost)
			e.holdGen++
			s.admit(id, &centralRes{c: c, s: s, ep: ep, gen: e.holdGen})
			c.scheduleRenew(s, ep)
			return
		}
		e.req = -1
		s.reject(id)
	case holding: // a renewal came back
		if e.settle != nil {
			c.sendSettle(s, ep)
			return
		}
		c.scheduleRenew(s, ep)
		return
	}
	e.phase, e.req, e.hold = idle, -1, ration.Amount{}
	c.free[e.inst] = append(c.free[e.inst], ep)
}

func (c *central) scheduleRenew(s *sim, ep int32) {
	s.q.push(event{at: s.at(s.cfg.TTL / 2), kind: evRenew, a: ep, g: s.eps[ep].holdGen})
}

// renew keeps slot ep's holding alive while its request runs.
func (c *central) renew(s *sim, ep int32, gen uint32) {
	e := s.eps[ep]
	if e.phase != holding || e.holdGen != gen || e.body != nil || e.settle != nil {
		return
	}
	c.call(s, ep, ration.Amount{}, ration.Amount{}, ration.Amount{}, e.hold)
}

// sendSettle returns the unused part of the slot's holding (or reports the
// overrun) and lets the holding go.
func (c *central) sendSettle(s *sim, ep int32) {
	e := s.eps[ep]
	a := limited(s.cfg.Limits, *e.settle)
	ret := ration.Amount{Requests: max(0, e.hold.Requests-a.Requests), Tokens: max(0, e.hold.Tokens-a.Tokens)}
	debt := ration.Amount{Requests: max(0, a.Requests-e.hold.Requests), Tokens: max(0, a.Tokens-e.hold.Tokens)}
	e.phase, e.req, e.settle = settling, -1, nil
	c.call(s, ep, ration.Amount{}, ret, debt, ration.Amount{})
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

func (r *centralRes) Settle(actual ration.Amount) {
	e := r.s.eps[r.ep]
	if r.done || e.holdGen != r.gen || e.phase != holding {
		return
	}
	r.done = true
	e.settle = &actual
	if e.body == nil {
		r.c.sendSettle(r.s, r.ep)
	}
}

func (r *centralRes) Cancel()                { r.Settle(ration.Amount{}) }
func (r *centralRes) Status() spender.Status { return spender.Status{} }

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
