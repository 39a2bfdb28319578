package allocator

import (
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect/v2"
	"google.golang.org/protobuf/proto"

	"github.com/rationhq/ration/allocator/ledger"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

// A new leader whose clock is behind the latest instant the ledger applied
// (its predecessor's clock ran ahead) does not stamp its calls with its
// own, earlier now: the ledger would apply them at the later instant, and
// a reservation's wait, counted from there, would end early by the
// difference on the new leader's clock (told 5 s when the reserved
// instant is 10 s ahead of it). Within the wait it allows, the leader
// waits on its clock until it reaches that instant, then proposes; beyond
// it, it refuses the call (Unavailable, retry the same call) without
// applying anything, and the same call is answered once its clock has
// caught up. Closed while it waits, it answers ErrClosed, nothing
// applied. Every member's state is a one-process Ledger's that applied
// the same calls at the instants the cluster did.
func TestReplicatedLeaderWaitsForItsClock(t *testing.T) {
	const skew = 5 * time.Second
	for _, tc := range []struct {
		name  string
		wait  time.Duration // withClockWait; 0: the election timeout (200 ms here)
		close bool          // the leader is closed while it waits
	}{
		{"within the wait", 10 * time.Second, false},
		{"beyond the wait", 0, false},
		{"closed while waiting", 10 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clocks := []*fakeClock{newFakeClock(), newFakeClock(), newFakeClock()}
			m := newMembersWith(t, 3, func(i int) []Option {
				o := []Option{WithClock(clocks[i])}
				if tc.wait > 0 {
					o = append(o, withClockWait(tc.wait))
				}
				return o
			})
			refClk := newFakeClock()
			ref := newLedger(t, refClk)
			refSvc := NewService(ref)
			t0 := refClk.Now()

			// The first leader's clock runs skew ahead; it drains the key.
			lead := m.leader()
			clocks[lead].Advance(skew)
			refClk.Advance(skew)
			drain := &leasev1.AcquireRequest{Caller: &leasev1.Caller{SpenderId: "fast", Epoch: 1, Sequence: 1},
				Keys: []*leasev1.KeyAcquire{{Key: "clock", Limits: &leasev1.Limits{Rpm: 60}, Want: &leasev1.Amount{Requests: 60}}}}
			if _, err := m.svc[lead].Acquire(ctx, drain); err != nil {
				t.Fatal(err)
			}
			if _, err := refSvc.Acquire(ctx, drain); err != nil {
				t.Fatal(err)
			}
			m.converge(memoryOf(ref).state.Snapshot())
			m.kill(lead)

			// The next leader's clock reads t0: skew behind. A reservation
			// of 5 requests on the drained key (one a second) is due 5 s
			// after the instant it is applied at.
			next := m.leader()
			if got := clocks[next].Now(); !got.Equal(t0) {
				t.Fatalf("the new leader's clock reads %v, want %v", got, t0)
			}
			reserve := &leasev1.ReserveAheadRequest{Caller: &leasev1.Caller{SpenderId: "slow", Epoch: 1, Sequence: 1},
				Keys: []*leasev1.KeyReserve{{Key: "clock", Limits: &leasev1.Limits{Rpm: 60}, Cost: &leasev1.Amount{Requests: 5},
					MaxWaitUs: time.Minute.Microseconds()}}}
			type answer struct {
				r   *leasev1.ReserveAheadResponse
				err error
			}
			answered := make(chan answer, 1)
			go func() {
				r, err := m.svc[next].ReserveAhead(ctx, reserve)
				answered <- answer{r, err}
			}()
			var got answer
			if tc.wait > 0 {
				// It waits on its clock (a timer set for the difference),
				// answering nothing until the clock gets there.
				for deadline := time.Now().Add(10 * time.Second); clocks[next].Timers() == 0; time.Sleep(time.Millisecond) {
					select {
					case a := <-answered:
						t.Fatalf("answered with the clock %v behind, before it caught up: %v %v", skew, a.r, a.err)
					default:
					}
					if time.Now().After(deadline) {
						t.Fatal("the new leader set no timer on its clock within 10 s")
					}
				}
				if tc.close {
					m.kill(next)
					if got = <-answered; connect.CodeOf(got.err) != connect.CodeUnavailable || !errors.Is(got.err, ErrClosed) {
						t.Fatalf("closed while waiting for its clock: %v %v, want Unavailable, ErrClosed", got.r, got.err)
					}
					m.converge(memoryOf(ref).state.Snapshot()) // nothing applied
					return
				}
				clocks[next].Advance(skew)
				got = <-answered
			} else {
				// Refused at once, nothing applied, not even the call's session.
				got = <-answered
				if connect.CodeOf(got.err) != connect.CodeUnavailable || !strings.Contains(got.err.Error(), "retry the same call") {
					t.Fatalf("with the clock %v behind, past the wait: %v %v, want Unavailable, retry the same call", skew, got.r, got.err)
				}
				for i, l := range m.led {
					if !m.down[i] {
						if st, _ := l.Node().FSM().StateSnapshot(); string(st) != string(memoryOf(ref).state.Snapshot()) {
							t.Fatalf("member %d applied something for the refused call", i)
						}
					}
				}
				if !strings.Contains(m.logs.String(), "clock is behind") {
					t.Fatalf("no warning logged:\n%s", m.logs.String())
				}
				// Once the clock has caught up, the same call is answered.
				clocks[next].Advance(skew)
				got.r, got.err = m.svc[next].ReserveAhead(ctx, reserve)
			}
			if got.err != nil {
				t.Fatal(got.err)
			}
			want, err := refSvc.ReserveAhead(ctx, reserve)
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got.r, want) {
				t.Fatalf("reply\n%v\nwant the one-process ledger's\n%v", got.r, want)
			}
			// Received when the new leader's clock reads t0+skew, the wait
			// ends at the reserved instant, t0+skew+5s; not 5 s earlier.
			wait := time.Duration(got.r.GetKeys()[0].GetWaitUs()) * time.Microsecond
			if end, reserved := clocks[next].Now().Add(wait), t0.Add(skew+5*time.Second); end.Before(reserved) {
				t.Fatalf("told to wait %v at %v: ends %v before the reserved instant", wait, clocks[next].Now(), reserved.Sub(end))
			}
			m.converge(memoryOf(ref).state.Snapshot())
			if a := m.led[next].Node().FSM().AppliedNow(); a != ledger.InstantOf(t0.Add(skew)) {
				t.Fatalf("the ledger's latest instant %d, want %d (t0+skew)", a, ledger.InstantOf(t0.Add(skew)))
			}
		})
	}
}
