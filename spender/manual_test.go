package spender_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect/v2"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/spender"
)

// TestManualLeasing drives a leased Limiter by hand, as the simulator does:
// a pending Reserve, the call, a lost reply, the retry answered from the
// allocator's record, and fallback after repeated losses.
func TestManualLeasing(t *testing.T) {
	clk := fakeclock.New()
	src := newAllocator(t, clk)
	l := spender.New(clk, spender.WithLeases(src), spender.WithManualLeasing(), spender.WithSlowPathDeadline(time.Second))
	defer l.Close(context.Background())
	lim := ration.Limits{RPM: 60}
	one := ration.Amount{Requests: 1}

	if _, err := l.Reserve(ctx, "k", lim, one); !errors.Is(err, spender.ErrLeasePending) {
		t.Fatalf("first Reserve = %v, want ErrLeasePending", err)
	}
	c := l.NextCall()
	if c == nil || len(c.Request().GetKeys()) != 1 || c.Request().GetKeys()[0].GetNeed().GetRequests() != 1 {
		t.Fatalf("NextCall = %v, want one key needing 1 request", c)
	}
	if l.NextCall() != nil {
		t.Fatal("a second call while nothing is queued")
	}
	// The reply is lost after the allocator applied the call.
	if _, err := src.Acquire(ctx, c.Request()); err != nil {
		t.Fatal(err)
	}
	if l.Deliver(c, nil, connect.NewError(connect.CodeUnavailable, "lost")) {
		t.Fatal("a lost reply ended the call")
	}
	// The retry is answered from the record: the same grant, not a second.
	resp, err := src.Acquire(ctx, c.Request())
	if err != nil || !l.Deliver(c, resp, nil) {
		t.Fatalf("retry: %v", err)
	}
	granted := resp.GetKeys()[0].GetGranted().GetRequests()
	admitted := 0
	for {
		r, err := l.Reserve(ctx, "k", lim, one)
		if err != nil {
			break
		}
		r.Settle(one)
		admitted++
	}
	if int64(admitted) != granted {
		t.Fatalf("admitted %d from a grant of %d", admitted, granted)
	}

	// The last Reserve queued the key again; answer that call.
	if c := l.NextCall(); c != nil {
		resp, err := src.Acquire(ctx, c.Request())
		if err != nil || !l.Deliver(c, resp, nil) {
			t.Fatalf("second call: %v", err)
		}
	}

	// The allocator goes away: after the deadline the share policy decides.
	clk.Advance(30 * time.Second)
	if _, err := l.Reserve(ctx, "k", lim, one); !errors.Is(err, spender.ErrLeasePending) {
		t.Fatalf("Reserve without a lease = %v, want ErrLeasePending", err)
	}
	c = l.NextCall()
	for range 3 {
		l.Deliver(c, nil, connect.NewError(connect.CodeUnavailable, "partition"))
	}
	clk.Advance(2 * time.Second)
	// The fallback bucket at the key's share (60/min, one spender) starts
	// empty: the first request waits one refill, then is admitted.
	rej := mustReject(t, l, "k", lim, one)
	if rej.RetryAfter != time.Second {
		t.Fatalf("first fallback Reserve: RetryAfter %v, want 1s", rej.RetryAfter)
	}
	clk.Advance(time.Second)
	if _, err := l.Reserve(ctx, "k", lim, one); err != nil {
		t.Fatalf("Reserve in fallback = %v, want admitted at the key's share", err)
	}
}

func TestAdmissionPath(t *testing.T) {
	clk := fakeclock.New()
	standalone := spender.New(clk)
	if p := spender.AdmissionPath(mustReserve(t, standalone, "k", ration.Limits{RPM: 1}, ration.Amount{Requests: 1})); p != spender.PathStandalone {
		t.Errorf("standalone path %q", p)
	}
	if p := spender.AdmissionPath(mustReserve(t, standalone, "k", ration.Limits{}, ration.Amount{Requests: 1})); p != spender.PathUnlimited {
		t.Errorf("unlimited path %q", p)
	}
	l := newLeased(t, clk, newAllocator(t, clk))
	lim := ration.Limits{RPM: 600}
	if p := spender.AdmissionPath(mustReserve(t, l, "k", lim, ration.Amount{Requests: 1})); p != spender.PathSlow {
		t.Errorf("first leased admission path %q, want slow", p)
	}
	if p := spender.AdmissionPath(mustReserve(t, l, "k", lim, ration.Amount{Requests: 1})); p != spender.PathLease {
		t.Errorf("second leased admission path %q, want local", p)
	}
}
