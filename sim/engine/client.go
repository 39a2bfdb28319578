package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/rationhq/ration/spender"
)

// The client contract: what a refused client is told, beside what the
// ideal single bucket would have told it, whether a client that honours
// Retry-After is admitted when it comes back, and what a gateway still
// holds a TTL after its last request.

// Late is when a Retry-After counts as late against the ideal's exact
// wait w: when it exceeds w by more than LateSlack + w/LateSlackDiv (the
// header's rounding up to whole seconds, and a tenth).
const (
	LateSlack    = time.Second
	LateSlackDiv = 10
)

// clientSends sends the client's next request, or (retry) the request it
// was refused and sends again, to the instance the scenario's router picks
// now.
func (s *sim) clientSends(retry bool) {
	id := s.alloc()
	r := &s.reqs[id]
	if retry {
		*r = s.retry
		r.at = s.now
		r.origin = s.tr.router.pick(s.crng, s.now, s.live, int(r.key))
		r.inst = r.origin
		s.col.retries++
	} else {
		s.tr.draw(s.crng, r, s.now, s.live)
		r.client = true
	}
	s.offer(id)
	s.release(id)
}

// told records what request id's client is told by refusal rej, beside
// the ideal's exact wait for the same request now, and has the scenario's
// client send it again RetryAfterSeconds later, within the traffic. A
// cost that can never be admitted has no Retry-After, and is not counted.
func (s *sim) told(id int32, rej *spender.RejectError) {
	if rej.Oversize {
		return
	}
	ra := rej.RetryAfter
	if s.cfg.retryAfter != nil {
		ra = s.cfg.retryAfter(ra)
	}
	r := &s.reqs[id]
	ideal := s.idealWaitNow(r)
	s.col.onRefusal(ra, ideal)
	if !r.client {
		return
	}
	wait := time.Duration(spender.RetryAfterSeconds(ra)) * time.Second
	at := s.now + int64(wait/time.Microsecond)
	if at >= s.end {
		return
	}
	if wait < ideal {
		s.col.retriesEarly++
	}
	// The one client has one request out at a time: what it sends again
	// waits here, not in a request slot (allocating one now could move
	// the slots under the strategy's feet).
	s.retry = request{key: r.key, nch: r.nch, ch: r.ch, service: r.service, ep: -1,
		client: true, attempt: r.attempt + 1}
	s.q.push(event{at: at, kind: evClient, a: 1})
}

// idealWaitNow is the ideal single bucket's exact wait for request r at
// this instant: 0 when it admitted r on arrival, its wait then when r is
// decided at its arrival instant, and otherwise what it answers now (an
// exact bucket asked and cancelled at one instant is left as it was).
func (s *sim) idealWaitNow(r *request) time.Duration {
	if r.idealWait == 0 || s.now == r.at {
		return r.idealWait
	}
	var err error
	if r.nch == 1 {
		b := &s.budgets[r.ch[0].b]
		var res spender.Reservation
		if res, err = s.shadow.Reserve(s.ctx, b.name, b.lim, r.ch[0].cost); err == nil {
			res.Cancel()
		}
	} else {
		var rs *spender.Reservations
		if rs, err = s.shadow.ReserveAll(s.ctx, s.chargesOf(r)); err == nil {
			rs.Cancel()
		}
	}
	if err != nil {
		return rejectWait(err)
	}
	return 0
}

// rejectWait is the wait a refusal names.
func rejectWait(err error) time.Duration {
	var rej *spender.RejectError
	if !errors.As(err, &rej) {
		panic(fmt.Sprintf("engine: the ideal bucket: %v", err)) // the sim's charges are valid
	}
	return rej.RetryAfter
}

// ended notes that a request on instance i ended (settled, or refused):
// the instance's holdings are checked once it has gone a TTL since
// (idleCheck). A request still in flight has not ended: what it holds
// cannot be given back yet.
func (s *sim) ended(i int32) {
	c := &s.col
	c.lastEnd[i] = s.now
	if !c.idlePending[i] {
		c.idlePending[i] = true
		s.q.push(event{at: s.idleDue(s.now), kind: evIdle, a: i})
	}
}

// idleDue is when an instance whose last request ended at end must hold
// nothing: a TTL later, or, if its allocator was unreachable within that
// TTL, a TTL after it is reachable again (nothing can be given back to
// an allocator the gateway cannot reach).
func (s *sim) idleDue(end int64) int64 {
	ttl := int64(s.cfg.TTL / time.Microsecond)
	if end < s.outTo && end+ttl > s.outFrom {
		return max(end, s.outTo) + ttl
	}
	return end + ttl
}

// idleCheck measures what instance i holds once it has gone a TTL (see
// idleDue) since its last request ended with none in flight, or waits for
// the next end when one came meanwhile.
func (s *sim) idleCheck(i int32) {
	c := &s.col
	in := &s.insts[i]
	if in.inflight > 0 {
		c.idlePending[i] = false // its end schedules the check again
		return
	}
	if due := s.idleDue(c.lastEnd[i]); due > s.now {
		s.q.push(event{at: due, kind: evIdle, a: i})
		return
	}
	c.idlePending[i] = false
	keys := int64(0)
	if in.m != nil && !in.closed {
		keys = int64(in.m.Counts().KeysHeld)
	}
	c.onIdle(s, i, keys)
}
