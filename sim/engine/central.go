package engine

import (
	"fmt"

	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// central asks the allocator about every request: one Acquire with
// want = need = the request's cost through the simulated network, from a
// pool of connection slots per instance (each slot is a caller with its
// own exactly-once session, since a caller may have only one call in
// flight). At settlement the slot makes a second call returning the
// unused part and its holding. The allocator runs strict, so this is the
// exact global bucket, one round trip away.
//
// A request not decided within the slow-path deadline (a lost message, an
// outage) is rejected: central fails closed. Its slot keeps resending the
// call and gives back anything granted late.
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

func (c *central) slot(s *sim, i int32) int32 {
	if n := len(c.free[i]); n > 0 {
		ep := c.free[i][n-1]
		c.free[i] = c.free[i][:n-1]
		return ep
	}
	return s.newEndpoint(i)
}

// call starts ep's next call for key with the given amounts.
func (c *central) call(s *sim, ep int32, want, returned, debt spender.Cost) {
	e := s.eps[ep]
	e.seq++
	amt := func(x spender.Cost) *leasev1.Amount {
		return &leasev1.Amount{Requests: x.Requests, Tokens: x.Tokens}
	}
	lim := s.cfg.Limits
	s.begin(ep, &leasev1.AcquireRequest{
		Caller: &leasev1.Caller{SpenderId: fmt.Sprintf("central-%d", ep), Epoch: 1, Sequence: e.seq},
		Keys: []*leasev1.KeyAcquire{{
			Key:    key,
			Limits: &leasev1.Limits{Rpm: lim.RPM, Tpm: lim.TPM, BurstRequests: lim.BurstRequests, BurstTokens: lim.BurstTokens},
			Want:   amt(want), Need: amt(want), Returned: amt(returned), Debt: amt(debt),
			Held: amt(spender.Cost{}),
		}},
	})
}

func (c *central) arrive(s *sim, id int32) {
	r := &s.reqs[id]
	ep := c.slot(s, r.inst)
	e := s.eps[ep]
	e.req, e.phase = id, deciding
	r.ep, r.parked = ep, true
	s.q.push(event{at: s.at(s.cfg.SlowDeadline), kind: evParkDeadline, b: id})
	c.call(s, ep, limited(s.cfg.Limits, r.cost), spender.Cost{}, spender.Cost{})
}

// parkDeadline rejects a request still undecided (fail closed).
func (c *central) parkDeadline(s *sim, id int32) {
	s.eps[s.reqs[id].ep].req = -1
	s.reject(id)
}

func (c *central) answered(s *sim, ep int32, g reply) {
	e := s.eps[ep]
	e.body = nil
	switch e.phase {
	case deciding:
		kg := g.resp.GetKeys()[0]
		ok := kg.GetStatus() == leasev1.GrantStatus_GRANT_STATUS_OK
		if e.req >= 0 {
			id := e.req
			if ok {
				e.phase = holding
				s.admit(id, &centralRes{c: c, s: s, ep: ep, cost: limited(s.cfg.Limits, s.reqs[id].cost)})
				return
			}
			e.req = -1
			s.reject(id)
		} else if ok { // granted after its request gave up: give it back
			gr := kg.GetGranted()
			e.phase = settling
			c.call(s, ep, spender.Cost{}, spender.Cost{Requests: gr.GetRequests(), Tokens: gr.GetTokens()}, spender.Cost{})
			return
		}
	case settling:
	}
	e.phase, e.req = idle, -1
	c.free[e.inst] = append(c.free[e.inst], ep)
}

// centralRes is a central admission: settling it starts the slot's
// second call.
type centralRes struct {
	c    *central
	s    *sim
	ep   int32
	cost spender.Cost
	done bool
}

func (r *centralRes) Settle(actual spender.Cost) {
	if r.done {
		return
	}
	r.done = true
	a := limited(r.s.cfg.Limits, actual)
	ret := spender.Cost{Requests: max(0, r.cost.Requests-a.Requests), Tokens: max(0, r.cost.Tokens-a.Tokens)}
	debt := spender.Cost{Requests: max(0, a.Requests-r.cost.Requests), Tokens: max(0, a.Tokens-r.cost.Tokens)}
	e := r.s.eps[r.ep]
	e.phase, e.req = settling, -1
	r.c.call(r.s, r.ep, spender.Cost{}, ret, debt)
}

func (r *centralRes) Cancel()                { r.Settle(spender.Cost{}) }
func (r *centralRes) Status() spender.Status { return spender.Status{} }

// limited zeroes the dimensions lim leaves unlimited.
func limited(lim spender.Limits, c spender.Cost) spender.Cost {
	if lim.RPM == 0 {
		c.Requests = 0
	}
	if lim.TPM == 0 {
		c.Tokens = 0
	}
	return c
}
