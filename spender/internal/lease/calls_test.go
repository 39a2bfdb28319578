package lease

import (
	"math"
	"testing"
	"time"

	"github.com/rationhq/ration/bucket"
)

var testTuning = Tuning{SlowPathDeadline: 50 * time.Millisecond, BatchWindow: time.Millisecond, Horizon: 2 * time.Second,
	MaintenanceInterval: 250 * time.Millisecond, CallTimeout: 2 * time.Second}

const ms = bucket.Instant(1000) // a millisecond in instants (microseconds)

// TestCallsBatchAndResend: queued keys wait for the batching window unless
// urged; one call at a time; a failed call comes back with the same
// sequence after its backoff, and is answered once.
func TestCallsBatchAndResend(t *testing.T) {
	m := NewCalls("gw", 7, testTuning, 0)
	m.Queue(0)
	m.Queue(0)
	if c, _ := m.Next(0); c != nil {
		t.Fatalf("a call inside the batching window: %+v", c)
	}
	if w := m.NextWake(0); w != 1*ms {
		t.Fatalf("next wake %v, want the end of the batching window", w)
	}
	c, fresh := m.Next(1 * ms)
	if c == nil || !fresh || c.Kind != Acquire || c.Size != 2 || c.Caller != (Caller{ID: "gw", Epoch: 7, Seq: 1}) {
		t.Fatalf("call %+v (fresh %v), want a new Acquire of 2 keys, sequence 1", c, fresh)
	}
	m.Queue(1 * ms)
	m.Urge()
	if c2, _ := m.Next(1 * ms); c2 != nil {
		t.Fatal("a second call while one is in flight")
	}
	out := m.Failed(2*ms, c, Failure{Kind: FailTransport})
	if out.Verdict != Retry || out.Unreachable {
		t.Fatalf("one failure after 1ms: %+v, want a retry, not unreachable", out)
	}
	at := m.NextWake(2 * ms)
	if at <= 2*ms || at > 2*ms+10*ms {
		t.Fatalf("resend at %v, want within the 10ms first backoff", at)
	}
	if again, _ := m.Next(at - 1); again != nil {
		t.Fatal("resent before its backoff")
	}
	again, fresh := m.Next(at)
	if again != c || fresh || again.Caller.Seq != 1 {
		t.Fatalf("resend %+v (fresh %v), want the same call and sequence", again, fresh)
	}
	if recovered := m.Answered(at+ms, c, 10*time.Second); recovered {
		t.Fatal("an answer ended a fallback that was never on")
	}
	if e := m.Env(); e.TTL != 10*time.Second || e.Fallback {
		t.Fatalf("env %+v after the answer", e)
	}
	next, fresh := m.Next(at + ms) // the urged key
	if next == nil || !fresh || next.Size != 1 || next.Caller.Seq != 2 {
		t.Fatalf("the urged key's call %+v, want a new call of 1 key, sequence 2", next)
	}
}

// TestCallsUnreachable: a call failing past the slow-path deadline makes
// the allocator unreachable; attempts the driver cut count only past the
// slow-path deadline plus the call timeout; a refused credential at once.
func TestCallsUnreachable(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    Failure
		at   bucket.Instant
		want bool
	}{
		{"failed within the deadline", Failure{Kind: FailTransport}, 10 * ms, false},
		{"failed past the deadline", Failure{Kind: FailTransport}, 60 * ms, true},
		{"cut past the deadline", Failure{Kind: FailTransport, Cut: true}, 60 * ms, false},
		{"cut past deadline and timeout", Failure{Kind: FailTransport, Cut: true}, 2060 * ms, true},
		{"credential refused", Failure{Kind: FailTransport, Refused: true}, 1 * ms, true},
	} {
		m := NewCalls("gw", 1, testTuning, 0)
		m.Queue(0)
		m.Urge()
		c, _ := m.Next(0)
		if out := m.Failed(tc.at, c, tc.f); out.Verdict != Retry || out.Unreachable != tc.want {
			t.Errorf("%s: %+v, want a retry, unreachable %v", tc.name, out, tc.want)
		}
	}
	m := NewCalls("gw", 1, testTuning, 0)
	m.Queue(0)
	m.Urge()
	c, _ := m.Next(0)
	for i := range 3 {
		out := m.Failed(bucket.Instant(i)*ms, c, Failure{Kind: FailTransport})
		if out.Unreachable != (i == 2) {
			t.Fatalf("failure %d: unreachable %v, want it at the third", i+1, out.Unreachable)
		}
		c.inFlight = true // sent again
	}
	if !m.Failing() {
		t.Fatal("a call that failed three times is not failing")
	}
}

// TestCallsRefusals: a key refused alone leaves the call, which goes again
// at once under a new sequence; a stale epoch before any answer starts a
// new one above the allocator's; after an answer it is a duplicate, and
// the machine stops.
func TestCallsRefusals(t *testing.T) {
	m := NewCalls("gw", 5, testTuning, 0)
	for range 3 {
		m.Queue(0)
	}
	m.Urge()
	c, _ := m.Next(0)
	if out := m.Failed(ms, c, Failure{Kind: FailKey, Index: 1}); out.Verdict != TakeOut || out.Emptied || c.Size != 2 {
		t.Fatalf("%+v, size %d: want the key out and 2 left", out, c.Size)
	}
	if again, _ := m.Next(ms); again != c || again.Caller.Seq != 2 {
		t.Fatalf("%+v: want the rest again at once, sequence 2", again)
	}
	out := m.Failed(2*ms, c, Failure{Kind: FailStale, StaleEpoch: true, Latest: 9, Wall: 3})
	if out.Verdict != NewEpoch {
		t.Fatalf("stale epoch before any answer: %+v, want a new epoch", out)
	}
	again, _ := m.Next(2 * ms)
	if again != c || again.Caller.Epoch != 10 || again.Caller.Seq != 1 {
		t.Fatalf("%+v: want the same call in epoch 10, sequence 1", again)
	}
	m.Answered(3*ms, c, time.Second)
	m.Queue(3 * ms)
	m.Urge()
	c, _ = m.Next(3 * ms)
	if out := m.Failed(4*ms, c, Failure{Kind: FailStale, StaleEpoch: true, Latest: 11}); out.Verdict != Stop || !out.Duplicate {
		t.Fatalf("stale epoch after an answer: %+v, want a stop for a duplicate", out)
	}
	m.Queue(5 * ms)
	m.Urge()
	if c, _ := m.Next(5 * ms); c != nil || !m.Stopped() || m.NextWake(5*ms) != m.nextTick {
		t.Fatal("a stopped machine makes calls or wakes for them")
	}
	m = NewCalls("gw", 5, testTuning, 0)
	m.Queue(0)
	m.Urge()
	c, _ = m.Next(0)
	if out := m.Failed(ms, c, Failure{Kind: FailStale, Latest: math.MaxUint64}); out.Verdict != Drop || !m.Idle() {
		t.Fatalf("%+v: an unknown epoch drops the call", out)
	}
}

// TestCallsReplay: the same inputs give the same calls, backoffs and
// wakes (the jitter's source is seeded by the spender's id and epoch).
func TestCallsReplay(t *testing.T) {
	run := func() []bucket.Instant {
		m := NewCalls("gw-3", 42, testTuning, 0)
		var wakes []bucket.Instant
		now := bucket.Instant(0)
		for i := range 50 {
			m.Queue(now)
			if i%3 == 0 {
				m.Urge()
			}
			if c, _ := m.Next(now); c != nil {
				if i%4 == 0 {
					m.Answered(now+ms, c, time.Second)
				} else {
					m.Failed(now+ms, c, Failure{Kind: FailTransport, Cut: i%5 == 0})
				}
			}
			m.Tick(now)
			now = max(now+ms, m.NextWake(now))
			wakes = append(wakes, now, bucket.Instant(m.AttemptTimeout()))
		}
		return wakes
	}
	a, b := run(), run()
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("step %d: %v then %v from the same inputs", i/2, a[i], b[i])
		}
	}
}
