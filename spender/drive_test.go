package spender_test

import (
	"errors"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/internal/leasedrive"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// drivenSource keeps the machine of the Limiter built on it (as the
// simulator does) and answers Close's Release from the allocator.
type drivenSource struct {
	*allocator.Service
	m leasedrive.Machine
}

func (s *drivenSource) Drive(m leasedrive.Machine) { s.m = m }

// send makes the machine's next call against the allocator and delivers
// the answer; it fails the test if the machine has no call to make.
func (s *drivenSource) send(t *testing.T) *leasev1.AcquireRequest {
	t.Helper()
	c := s.m.NextCall()
	if c == nil {
		t.Fatal("the machine has no call to make")
	}
	req := c.Request().(*leasev1.AcquireRequest)
	resp, err := s.Acquire(ctx, req)
	s.m.Deliver(c, resp, err)
	return req
}

// TestDrivenReserveAll: the machine's ReserveAll, moved by hand as the
// simulator moves it, asks the allocator for every budget without a lease
// in one call, admits all of them once the answer is in, refuses all or
// nothing naming the budget that refused, and refuses bad charges before
// asking anything.
func TestDrivenReserveAll(t *testing.T) {
	clk := fakeclock.New()
	src := &drivenSource{Service: newAllocator(t, clk, allocator.WithTTL(10*time.Second))}
	newLimiter(t, clk, spender.WithLeases(src), spender.WithShards(1), spender.WithSpenderID("gw"), spender.WithEpoch(1), testTuning(50*time.Millisecond))
	if src.m == nil {
		t.Fatal("spender.New did not hand the machine to the driving source")
	}
	key, team := ration.Limits{RPM: 60}, ration.Limits{RPM: 2}
	charges := []leasedrive.Charge{
		{Key: "k", Limits: key, Cost: ration.Amount{Requests: 1}},
		{Key: "team", Limits: team, Cost: ration.Amount{Requests: 1}},
	}

	_, w, err := src.m.ReserveAll(charges, nil)
	if w == nil || err != nil {
		t.Fatalf("first ask: wait %v, err %v; want a Wait (no lease yet)", w, err)
	}
	if got := src.send(t); len(got.GetKeys()) != 2 {
		t.Fatalf("the call carries %d keys, want both budgets in one call", len(got.GetKeys()))
	}
	r, w, err := src.m.ReserveAll(charges, w)
	if w != nil || err != nil {
		t.Fatalf("after the answer: wait %v, err %v; want an admission", w, err)
	}
	rs := r.(*spender.Reservations)
	if rs.Len() != 2 || spender.AdmissionPath(rs.Part(0)) != spender.PathSlow || spender.AdmissionPath(rs.Part(1)) != spender.PathSlow {
		t.Fatalf("admitted %d parts on paths %v, %v; want 2 after the allocator call", rs.Len(), spender.AdmissionPath(rs.Part(0)), spender.AdmissionPath(rs.Part(1)))
	}

	// The team's 2 requests: the second from its lease or after one more
	// call, the third refused by the team alone.
	var rej *spender.RejectError
	for i := 2; ; i++ {
		var w leasedrive.Wait
		for {
			_, w, err = src.m.ReserveAll(charges, w)
			if w == nil {
				break
			}
			src.send(t)
		}
		if err == nil {
			if i > 2 {
				t.Fatalf("admitted request %d, above the team's capacity 2", i)
			}
			continue
		}
		if !errors.As(err, &rej) || rej.Key != "team" || rej.RetryAfter <= 0 {
			t.Fatalf("request %d: %v; want a refusal naming the team with a wait", i, err)
		}
		break
	}
	// All or nothing: the key, charged alone, still has its 58.
	n := 0
	for ; n < 100; n++ {
		var w leasedrive.Wait
		for {
			_, w, err = src.m.ReserveAll(charges[:1], w)
			if w == nil {
				break
			}
			src.send(t)
		}
		if err != nil {
			break
		}
	}
	if n != 58 {
		t.Errorf("the key alone admitted %d after the team refused, want 58 (60 less the two charged with the team)", n)
	}

	dup := []leasedrive.Charge{charges[0], charges[0]}
	if _, w, err := src.m.ReserveAll(dup, nil); w != nil || !errors.Is(err, spender.ErrInvalidCharges) {
		t.Errorf("a key charged twice: wait %v, err %v; want ErrInvalidCharges", w, err)
	}
	if c := src.m.NextCall(); c != nil {
		t.Errorf("bad charges queued a call: %v", c.Request())
	}
}
