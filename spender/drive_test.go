package spender_test

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"connectrpc.com/connect/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/internal/fakeclock"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// drivenSource keeps the machine of the Limiter built on it (as the
// simulator does) and answers Close's Release from the allocator.
type drivenSource struct {
	*allocator.Service
	m *spender.Machine
}

func (s *drivenSource) Drive(m *spender.Machine) { s.m = m }

// send makes the machine's next call against the allocator and delivers
// the answer; it fails the test if the machine has no call to make.
func (s *drivenSource) send(t *testing.T) *leasev1.AcquireRequest {
	t.Helper()
	c := s.m.NextCall()
	if c == nil {
		t.Fatal("the machine has no call to make")
	}
	req := c.Acquire()
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
	charges := []spender.Charge{
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
	rs := r
	if rs.Len() != 2 || spender.AdmissionPath(rs.Part(0)) != spender.PathSlow || spender.AdmissionPath(rs.Part(1)) != spender.PathSlow {
		t.Fatalf("admitted %d parts on paths %v, %v; want 2 after the allocator call", rs.Len(), spender.AdmissionPath(rs.Part(0)), spender.AdmissionPath(rs.Part(1)))
	}

	// The team's 2 requests: the second from its lease or after one more
	// call, the third refused by the team alone.
	var rej *spender.RejectError
	for i := 2; ; i++ {
		var w *spender.Wait
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
		var w *spender.Wait
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

	dup := []spender.Charge{charges[0], charges[0]}
	if _, w, err := src.m.ReserveAll(dup, nil); w != nil || !errors.Is(err, spender.ErrInvalidCharges) {
		t.Errorf("a key charged twice: wait %v, err %v; want ErrInvalidCharges", w, err)
	}
	if c := src.m.NextCall(); c != nil {
		t.Errorf("bad charges queued a call: %v", c.Acquire())
	}
}

// TestMachineCounts: a Machine's counts are what its Limiter's metrics
// say: the keys held at the last maintenance, the admissions under the
// fallback policy, the refill shares' accrual.
func TestMachineCounts(t *testing.T) {
	clk := fakeclock.New()
	reg := prometheus.NewPedanticRegistry()
	metrics, err := spender.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	src := &drivenSource{Service: newAllocator(t, clk, allocator.WithTTL(10*time.Second))}
	newLimiter(t, clk, spender.WithLeases(src), spender.WithShards(1), spender.WithSpenderID("gw"), spender.WithEpoch(1),
		testTuning(50*time.Millisecond), spender.WithMetrics(metrics), spender.WithFallback(spender.FailOpen), spender.WithLogger(slog.New(slog.DiscardHandler)))
	lim, one := ration.Limits{RPM: 60}, ration.Amount{Requests: 1}
	compare := func(keys int, fallback int64) {
		t.Helper()
		got := src.m.Counts()
		if got.KeysHeld != keys || got.FallbackAdmissions != fallback {
			t.Fatalf("counts %+v, want %d keys held and %d fallback admissions", got, keys, fallback)
		}
		if v := metricValue(t, reg, "ration_spender_keys_held", "", ""); int(v) != got.KeysHeld {
			t.Fatalf("keys_held %v, Counts %d", v, got.KeysHeld)
		}
		if v := metricValue(t, reg, "ration_spender_admitted_total", "path", "fallback"); int64(v) != got.FallbackAdmissions {
			t.Fatalf("admitted_total{path=fallback} %v, Counts %d", v, got.FallbackAdmissions)
		}
		acc := ration.Amount{Requests: int64(metricValue(t, reg, "ration_spender_share_accrued_total", "dimension", "requests")),
			Tokens: int64(metricValue(t, reg, "ration_spender_share_accrued_total", "dimension", "tokens"))}
		if acc != got.ShareAccrued {
			t.Fatalf("share_accrued_total %+v, Counts %+v", acc, got.ShareAccrued)
		}
	}
	compare(0, 0)

	_, _, w, _ := src.m.Reserve("k", lim, one, 0, false, nil)
	src.send(t)
	if r, _, _, err := src.m.Reserve("k", lim, one, 0, false, w); r == nil || err != nil {
		t.Fatalf("after the answer: %v, %v", r, err)
	}
	clk.Advance(time.Second)
	src.m.Tick()
	compare(1, 0)

	// The allocator fails a call past the slow-path deadline: the key
	// without a lease is admitted by the fallback policy.
	_, _, w, _ = src.m.Reserve("other", lim, one, 0, false, nil)
	clk.Advance(100 * time.Millisecond)
	c := src.m.NextCall()
	if c == nil {
		t.Fatal("no call for the key without a lease")
	}
	src.m.Deliver(c, nil, connect.NewError(connect.CodeUnavailable, "down"))
	if r, _, _, err := src.m.Reserve("other", lim, one, 0, false, w); r == nil || err != nil || spender.AdmissionPath(r) != spender.PathFallback {
		t.Fatalf("in the outage: %v, %v; want a fallback admission", r, err)
	}
	clk.Advance(time.Second)
	src.m.Tick()
	compare(2, 1)
}

// metricValue is the value of the series of name in reg whose label is
// value (any series, for label ""); it fails the test if there is none.
func metricValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, lp := range m.GetLabel() {
				match = match || lp.GetName() == label && lp.GetValue() == value
			}
			if !match {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}
