package engine

import (
	"errors"
	"fmt"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender"
)

// standalone is the static split and sticky routing: each instance has a
// standalone spender.Limiter (the one bucket implementation) and no
// allocator.
//
// Static: every live instance enforces limit/N on its own traffic, N the
// live count (integer division, at least 1 per limited dimension); a
// Limiter follows a changed N without minting tokens, a new instance
// starts full at its share.
//
// Sticky: every request goes to one owner instance, the live instance with
// the highest rendezvous hash of (seed, instance), whose Limiter holds the
// whole limit; when the owner changes, the new owner's Limiter (full, or
// as it was left) takes over.
type standalone struct {
	sticky bool
}

func (standalone) join(s *sim, i int32) {
	s.insts[i].lim = mustLimiter(s.clk, spender.WithShards(1))
}

func (standalone) leave(*sim, int32)           {}
func (standalone) drained(*sim, int32)         {}
func (standalone) tick(*sim)                   {}
func (standalone) finish(*sim)                 {}
func (standalone) parkDeadline(*sim, int32)    {}
func (standalone) answered(*sim, int32, reply) {}
func (standalone) failed(*sim, int32)          {}
func (standalone) refused(*sim, int32)         {}

// owner returns the sticky owner of API key k among the live instances:
// requests are routed by the key they carry, so a team's keys may have
// different owners, each holding the team's whole budget.
func (standalone) owner(s *sim, k int32) int32 {
	best, bestH := s.live[0], uint64(0)
	for _, i := range s.live {
		if h := mix(s.cfg.Seed ^ uint64(i+1)*0x9e3779b97f4a7c15 ^ uint64(k)*0xc2b2ae3d27d4eb4f); h >= bestH {
			best, bestH = i, h
		}
	}
	return best
}

func (st standalone) arrive(s *sim, id int32) {
	r := &s.reqs[id]
	n := int64(len(s.live))
	var err error
	if r.nch == 1 {
		b := &s.budgets[r.ch[0].b]
		lim := b.lim
		if !st.sticky {
			lim = share(lim, n)
		}
		var res spender.Reservation
		if res, err = s.insts[r.inst].lim.Reserve(s.ctx, b.name, lim, r.ch[0].cost); err == nil {
			s.admit(id, res)
			return
		}
	} else {
		cs := s.chargesOf(r)
		if !st.sticky {
			for i := range cs {
				cs[i].Limits = share(cs[i].Limits, n)
			}
		}
		var rs *spender.Reservations
		if rs, err = s.insts[r.inst].lim.ReserveAll(s.ctx, cs); err == nil {
			s.admitAll(id, rs)
			return
		}
	}
	var rej *spender.RejectError
	if !errors.As(err, &rej) {
		panic(fmt.Sprintf("engine: standalone Reserve: %v", err))
	}
	s.reject(id, rej)
}

// share is lim divided among n instances, at least 1 per limited dimension.
func share(lim ration.Limits, n int64) ration.Limits {
	div := func(v int64) int64 {
		if v == 0 {
			return 0
		}
		return max(1, v/n)
	}
	return ration.Limits{RPM: div(lim.RPM), TPM: div(lim.TPM), BurstRequests: div(lim.BurstRequests), BurstTokens: div(lim.BurstTokens), Window: lim.Window}
}

// mix is splitmix64's finaliser: a well-spread hash of x.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
