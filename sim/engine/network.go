package engine

import (
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect/v2"

	"github.com/rationhq/ration"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// endpoint is one caller of the allocator: a leased spender, or one
// connection slot of the central strategy. It has at most one call
// outstanding, resent with the same body after each failure (with the
// spender's backoff: 10ms doubling to 1s, half of it jittered) until it
// is answered.
type endpoint struct {
	inst      int32
	body      *leasev1.AcquireRequest // the call being sent; nil when idle
	attempt   uint32                  // attempt counter, never reset
	callFirst uint32                  // the first attempt of the current call
	sentAt    int64                   // the current attempt's send time
	first     int64                   // the current call's first send
	backoff   int64                   // µs before the next resend
	resp      reply                   // the reply in flight to the current attempt
	applied   uint64                  // the last sequence the allocator applied (replays are not counted twice)
	timeout   int64                   // µs before an attempt with no reply fails; 0 = the network's call timeout

	// central: the request this slot decides and where its call stands.
	req     int32
	phase   phase
	seq     uint64                    // the last sequence used
	nb      int32                     // budgets the slot's request is charged to
	bud     [maxCharges]int32         // those budgets
	hold    [maxCharges]ration.Amount // what the slot holds for its request, per budget
	holdGen uint32                    // counts admissions, to match renew events
	settle  [maxCharges]ration.Amount // the settlement's actual usage, once known (settled); sent after a renewal in flight
	settled bool
}

// phase is where a central slot stands.
type phase uint8

const (
	idle     phase = iota
	deciding       // asking for one request's cost
	holding        // the request was admitted; its holding is renewed until settlement
	settling       // giving back the unused part and the holding
)

// reply is the allocator's answer to an attempt: a response or an error.
type reply struct {
	resp *leasev1.AcquireResponse
	err  error
}

var (
	errLost    = fmt.Errorf("sim: message lost: %w", spender.ErrAttemptTimedOut)
	errRefused = errors.New("sim: allocator unreachable (connection refused)")
)

// newEndpoint adds an idle endpoint for instance i.
func (s *sim) newEndpoint(i int32) int32 {
	s.eps = append(s.eps, &endpoint{inst: i, req: -1})
	return int32(len(s.eps) - 1)
}

// begin starts sending body from endpoint ep.
func (s *sim) begin(ep int32, body *leasev1.AcquireRequest) {
	e := s.eps[ep]
	e.body, e.callFirst, e.first, e.backoff = body, e.attempt+1, s.now, 10_000
	s.send(ep)
}

// latency draws one message's one-way delay, µs.
func (s *sim) latency() int64 {
	n := s.cfg.Net
	d := int64(n.Latency / time.Microsecond)
	if j := int64(n.Jitter / time.Microsecond); j > 0 {
		d += s.nrng.Int64N(j)
	}
	return max(d, 1)
}

// attemptTimeout is how long e's sender waits for a reply, µs.
func (s *sim) attemptTimeout(e *endpoint) int64 {
	if e.timeout > 0 {
		return e.timeout
	}
	return int64(s.cfg.Net.CallTimeout / time.Microsecond)
}

func (s *sim) lost() bool { return s.cfg.Net.Loss > 0 && s.nrng.Float64() < s.cfg.Net.Loss }

// send makes one attempt of ep's call.
func (s *sim) send(ep int32) {
	e := s.eps[ep]
	e.attempt++
	e.sentAt = s.now
	s.col.calls++
	lat := s.latency()
	switch {
	case s.down(s.now + lat):
		s.q.push(event{at: s.now + 2*lat, kind: evNetFail, a: ep, g: e.attempt})
		e.resp = reply{err: errRefused}
	case s.lost():
		s.q.push(event{at: s.now + s.attemptTimeout(e), kind: evNetFail, a: ep, g: e.attempt})
		e.resp = reply{err: errLost}
	default:
		s.q.push(event{at: s.now + lat, kind: evNetArrive, a: ep, g: e.attempt})
	}
}

// netArrive applies attempt g of ep's call at the allocator and sends the
// reply back. An attempt of an earlier call (already answered) would be
// answered from the allocator's record or refused as stale and change
// nothing, so it is dropped here.
func (s *sim) netArrive(ep int32, g uint32) {
	e := s.eps[ep]
	if e.body == nil || g < e.callFirst {
		return
	}
	resp, err := s.src.Acquire(s.ctx, e.body)
	if err == nil {
		s.col.onAnswered(s, len(resp.GetKeys()))
	}
	if err == nil && e.body.GetCaller().GetSequence() != e.applied {
		e.applied = e.body.GetCaller().GetSequence()
		s.col.onApplied(s, ep, e.body, resp)
	}
	if g != e.attempt {
		return // the sender gave up on this attempt; the allocator applied it anyway
	}
	if err != nil {
		s.col.allocErrors++
	}
	e.resp = reply{resp: resp, err: err}
	if s.lost() {
		s.q.push(event{at: e.sentAt + s.attemptTimeout(e), kind: evNetFail, a: ep, g: g})
		e.resp = reply{err: errLost}
		return
	}
	s.q.push(event{at: s.now + s.latency(), kind: evNetReply, a: ep, g: g})
}

func (s *sim) netReply(ep int32, g uint32) {
	e := s.eps[ep]
	if e.body == nil || g != e.attempt {
		return
	}
	switch {
	case connect.CodeOf(e.resp.err) == connect.CodeInvalidArgument:
		// The allocator refused the body; resending it cannot help. The
		// real leaser gives such a call up and logs it; so does the sim.
		s.strat.refused(s, ep)
	case e.resp.err != nil:
		s.netFail(ep, g)
	default:
		s.strat.answered(s, ep, e.resp)
	}
}

func (s *sim) netFail(ep int32, g uint32) {
	e := s.eps[ep]
	if e.body == nil || g != e.attempt {
		return
	}
	s.strat.failed(s, ep)
	if e.body == nil {
		return // the strategy gave the call up
	}
	wait := e.backoff/2 + s.nrng.Int64N(e.backoff/2+1)
	e.backoff = min(2*e.backoff, 1_000_000)
	s.q.push(event{at: s.now + wait, kind: evNetResend, a: ep, g: g})
}

func (s *sim) netResend(ep int32, g uint32) {
	e := s.eps[ep]
	if e.body != nil && g == e.attempt {
		s.send(ep)
	}
}
