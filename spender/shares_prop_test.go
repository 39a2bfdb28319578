package spender

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"connectrpc.com/connect/v2"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/internal/leasewire"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

// handSource hands the Limiter's machine to the test, which sends its
// calls and answers them itself.
type handSource struct{ m *Machine }

func (s *handSource) Drive(m *Machine) { s.m = m }
func (s *handSource) Acquire(context.Context, *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	return nil, errors.New("handSource: the test answers")
}
func (s *handSource) ReserveAhead(context.Context, *leasev1.ReserveAheadRequest) (*leasev1.ReserveAheadResponse, error) {
	return nil, errors.New("handSource: no reserve-ahead")
}
func (s *handSource) Release(_ context.Context, r *leasev1.ReleaseRequest) (*leasev1.ReleaseResponse, error) {
	return &leasev1.ReleaseResponse{Returned: make([]*leasev1.Amount, len(r.GetKeys()))}, nil
}

// propReply is what the last answer applied to a key said: the bound on
// what the spender may hold from then on.
type propReply struct {
	held, burst ration.Amount
	share       ration.Share
	lim         ration.Limits
	recv        bucket.Instant
	expiry      bucket.Instant
}

// TestPropertyShareHoldingBound: under random Reserves, Settles, Cancels,
// clock steps, maintenance, calls held in flight, failed attempts and
// answers carrying random grants, shares and bursts, a key's avail +
// outstanding never exceeds max(the last answer's held, its share burst),
// nor the last answer's held plus the share's accrual since receipt
// rounded up (what the allocator counts), whether or not the key is
// looked at; before any answer it holds nothing.
func TestPropertyShareHoldingBound(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { propShareBound(t, seed, 3000) })
	}
}

func propShareBound(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 16))
	clk := fakeclock.New()
	src := &handSource{}
	lt := DefaultLeaseTuning()
	lt.BatchWindow = 0
	l, err := New(clk, WithLeases(src), WithShards(2), WithSpenderID("prop"), WithEpoch(1), WithLeaseTuning(lt))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	m := src.m
	keys := []string{"a", "b"}
	lims := map[string]ration.Limits{"a": {RPM: 600, TPM: 60_000}, "b": {RPM: 6000}}
	last := map[string]*propReply{}
	var open []Reservation
	var flight *LeaseCall
	var ttl time.Duration = 2 * time.Second
	var log []string
	note := func(format string, args ...any) {
		log = append(log, fmt.Sprintf("%v ", clk.Now().Sub(fakeclock.Epoch()))+fmt.Sprintf(format, args...))
		if len(log) > 40 {
			log = log[1:]
		}
	}

	answer := func(req *leasev1.AcquireRequest, recv bucket.Instant, sent bucket.Instant) *leasev1.AcquireResponse {
		if rng.IntN(4) == 0 {
			ttl = []time.Duration{500 * time.Millisecond, 2 * time.Second, 5 * time.Second}[rng.IntN(3)]
		}
		resp := &leasev1.AcquireResponse{LeaseTtlUs: int64(ttl / time.Microsecond)}
		for _, k := range req.GetKeys() {
			lim := leasewire.LimitsOf(k.GetLimits())
			var g ration.Amount
			if rng.IntN(2) == 0 {
				g = lim.Limited(ration.Amount{Requests: rng.Int64N(20), Tokens: rng.Int64N(2000)})
			}
			held := leasewire.AmountOf(k.GetHeld()).Add(g)
			kg := &leasev1.KeyGrant{Status: leasev1.GrantStatus_GRANT_STATUS_OK, Granted: leasewire.NewAmount(g), Held: leasewire.NewAmount(held), ActiveSpenders: 1,
				Snapshot: &leasev1.Snapshot{Requests: &leasev1.DimSnapshot{Remaining: rng.Int64N(3) * rng.Int64N(10)},
					Tokens: &leasev1.DimSnapshot{Remaining: rng.Int64N(3) * rng.Int64N(1000)}}}
			if rng.IntN(6) == 0 {
				kg.Status, kg.Granted, kg.Held = leasev1.GrantStatus_GRANT_STATUS_NOT_COVERED, leasewire.NewAmount(ration.Amount{}), leasewire.NewAmount(leasewire.AmountOf(k.GetHeld()))
				kg.RetryAfterUs = rng.Int64N(500_000)
				held = leasewire.AmountOf(k.GetHeld())
			}
			rep := &propReply{held: held, lim: lim, recv: recv, expiry: sent.Add(ttl)}
			if rng.IntN(4) != 0 {
				rep.share = ration.Share{Requests: uint32(rng.IntN(ration.ShareUnit + 1)), Tokens: uint32(rng.IntN(ration.ShareUnit + 1))}
				rep.burst = ration.Amount{Requests: rng.Int64N(60), Tokens: rng.Int64N(6000)}
				kg.Share = &leasev1.Share{RequestsPpm: rep.share.Requests, TokensPpm: rep.share.Tokens}
				kg.ShareBurst = leasewire.NewAmount(rep.burst)
			}
			last[k.GetKey()] = rep
			resp.Keys = append(resp.Keys, kg)
		}
		return resp
	}

	// check reads every key's level, as stored and as a look now would
	// make it, against the last answer.
	check := func(step int) {
		now := l.now()
		for i := range l.shards {
			sh := &l.shards[i]
			sh.mu.Lock()
			for st := range sh.keys.all() {
				stored, looked := st.lk.Holding(now)
				rep := last[st.key]
				var bound, counted ration.Amount
				if rep != nil {
					bound = rep.held.Max(rep.burst)
					counted = rep.held.Add(rep.lim.Accrued(rep.share, min(now, rep.expiry).Sub(rep.recv), true))
				}
				for _, lv := range []ration.Amount{stored, looked} {
					over := lv.Sub(bound)
					if lim := st.Lim; lim.RPM > 0 && over.Requests > 0 || lim.TPM > 0 && over.Tokens > 0 {
						sh.mu.Unlock()
						t.Fatalf("step %d, key %s: avail+outstanding %+v above max(held, burst) %+v (last answer %+v, in call %v)\n%v",
							step, st.key, lv, bound, rep, st.lk.InCall(), log)
					}
					over = lv.Sub(counted)
					if lim := st.Lim; lim.RPM > 0 && over.Requests > 0 || lim.TPM > 0 && over.Tokens > 0 {
						sh.mu.Unlock()
						t.Fatalf("step %d, key %s: avail+outstanding %+v above held + accrual since receipt %+v (last answer %+v)\n%v",
							step, st.key, lv, counted, rep, log)
					}
				}
			}
			sh.mu.Unlock()
		}
	}

	for step := range steps {
		switch op := rng.IntN(10); {
		case op < 4: // a request
			k := keys[rng.IntN(len(keys))]
			c := ration.Amount{Requests: 1 + rng.Int64N(4), Tokens: rng.Int64N(400)}
			r, _, _, err := m.Reserve(k, lims[k], c, 0, false, nil)
			note("reserve %s %+v: %v %v", k, c, r != nil, err)
			if r != nil {
				open = append(open, r.(Reservation))
			}
		case op < 6 && len(open) > 0: // settle or cancel
			i := rng.IntN(len(open))
			r := open[i]
			open = append(open[:i], open[i+1:]...)
			if rng.IntN(4) == 0 {
				r.Cancel()
				note("cancel")
			} else {
				lr := r.(*leasedReservation)
				a := ration.Amount{Requests: lr.cost.Requests, Tokens: rng.Int64N(2*lr.cost.Tokens + 1)}
				r.Settle(a)
				note("settle %+v of %+v", a, lr.cost)
			}
		case op < 8: // time passes
			d := time.Duration(rng.Int64N(int64(300 * time.Millisecond)))
			clk.Advance(d)
			m.Tick()
			note("advance %v", d)
		case flight == nil: // send
			flight = m.NextCall()
			if flight != nil {
				note("send %v", flight.Acquire())
			}
		default: // the call in flight ends
			c := flight
			flight = nil
			if rng.IntN(5) == 0 {
				m.Deliver(c, nil, connect.NewError(connect.CodeUnavailable, "lost"))
				note("attempt failed")
				continue
			}
			now := l.now()
			resp := answer(c.acquire, now, c.lc.Sent())
			m.Deliver(c, resp, nil)
			note("answered %v", resp)
		}
		check(step)
	}
}
