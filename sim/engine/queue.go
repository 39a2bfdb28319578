package engine

// kind names what an event does when its time comes.
type kind uint8

const (
	evArrival      kind = iota + 1 // the next request arrives (a = -, b = -)
	evSettle                       // request b's response is complete: settle it
	evShadowSettle                 // the ideal bucket's reservation for request b settles
	evParkDeadline                 // request b has waited a slow-path deadline
	evNetArrive                    // endpoint a's attempt g reaches the allocator
	evNetReply                     // the allocator's reply to endpoint a's attempt g arrives
	evNetFail                      // endpoint a's attempt g failed (timeout or refused)
	evNetResend                    // endpoint a resends after backoff (attempt g failed)
	evTick                         // maintenance tick for every leased spender
	evWake                         // leased instance a's machine asked to run now
	evSample                       // close one time-series bucket
	evJoin                         // instance a joins the fleet
	evLeave                        // instance a stops receiving traffic
	evRenew                        // central slot a renews its holding (generation g)
	evClient                       // the client sends its next request (a = 0) or sends again the one refused (a = 1)
	evIdle                         // instance a may have gone a TTL without a request
)

// event is one entry of the queue. Events at the same instant run in the
// order they were scheduled (seq), which keeps runs deterministic.
type event struct {
	at   int64  // virtual microseconds since the start of the run
	seq  uint64 // scheduling order, the tie-breaker
	kind kind
	a    int32  // instance or endpoint index, by kind
	b    int32  // request slot, by kind
	g    uint32 // attempt number, for network events
}

// queue is a binary min-heap of events ordered by (at, seq). It is a
// hand-rolled heap rather than container/heap: no interface calls and no
// boxing on the path every simulated request takes several times.
type queue struct {
	h   []event
	seq uint64
}

func (q *queue) len() int { return len(q.h) }

func (q *queue) less(i, j int) bool {
	a, b := &q.h[i], &q.h[j]
	return a.at < b.at || (a.at == b.at && a.seq < b.seq)
}

// push schedules e; its seq is assigned here.
func (q *queue) push(e event) {
	q.seq++
	e.seq = q.seq
	q.h = append(q.h, e)
	i := len(q.h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q.h[i], q.h[p] = q.h[p], q.h[i]
		i = p
	}
}

// pop removes and returns the earliest event; the queue must not be empty.
func (q *queue) pop() event {
	top := q.h[0]
	n := len(q.h) - 1
	q.h[0] = q.h[n]
	q.h = q.h[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && q.less(r, l) {
			m = r
		}
		if !q.less(m, i) {
			break
		}
		q.h[i], q.h[m] = q.h[m], q.h[i]
		i = m
	}
	return top
}

// peek returns the time of the earliest event; the queue must not be empty.
func (q *queue) peek() int64 { return q.h[0].at }
