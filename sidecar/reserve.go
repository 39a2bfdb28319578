package sidecar

import (
	"context"
	"time"

	"connectrpc.com/connect/v2"
	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/leasewire"
	sidecarv1 "github.com/rationhq/ration/proto/ration/sidecar/v1"
	"github.com/rationhq/ration/proto/ration/sidecar/v1/sidecarv1connect"
	"github.com/rationhq/ration/spender"
)

var _ sidecarv1connect.ReservationServiceHandler = (*Service)(nil)

// Reserve admits a request charged to every charge, all or nothing (see
// the proto). A refusal is a DECISION_RATE_LIMITED or DECISION_TOO_LARGE
// answer that reserved nothing; bad input is INVALID_ARGUMENT; at the
// bound of open reservations, UNAVAILABLE.
func (s *Service) Reserve(ctx context.Context, req *sidecarv1.ReserveRequest) (*sidecarv1.ReserveResponse, error) {
	charges := make([]spender.Charge, len(req.GetCharges()))
	for i, c := range req.GetCharges() {
		charges[i] = spender.Charge{Key: c.GetKey(), Limits: leasewire.LimitsOf(c.GetLimits()), Cost: leasewire.AmountOf(c.GetCost())}
	}
	maxWait := time.Duration(req.GetMaxWaitMs()) * time.Millisecond
	switch {
	case req.GetMaxWaitMs() < 0 || maxWait > ration.MaxWait:
		return nil, invalid("max_wait_ms %d: want 0 to %d", req.GetMaxWaitMs(), ration.MaxWait.Milliseconds())
	case maxWait > 0 && len(charges) != 1:
		return nil, invalid("max_wait_ms (wait mode) takes exactly one charge, not %d", len(charges))
	}
	if err := s.holds.claim(); err != nil {
		return nil, errFull(s.holds.max)
	}
	h, st, after, err := s.reserve(ctx, charges, maxWait)
	if err != nil {
		s.holds.release()
		rej, ok := err.(*spender.RejectError)
		if !ok {
			return nil, statusCodeOf(err)
		}
		d := sidecarv1.Decision_DECISION_RATE_LIMITED
		if rej.Oversize {
			d = sidecarv1.Decision_DECISION_TOO_LARGE
		}
		budget := rej.Key
		if budget == "" {
			budget = charges[0].Key
		}
		s.m.decision(apiReserve, d.String())
		return &sidecarv1.ReserveResponse{Decision: d, RetryAfterMs: ceilMillis(rej.RetryAfter),
			Headers: headersOf(rej.Status, rej), Message: rej.Error(), Budget: budget}, nil
	}
	id := newID()
	s.holds.put(id, h, after)
	s.m.decision(apiReserve, sidecarv1.Decision_DECISION_ADMITTED.String())
	return &sidecarv1.ReserveResponse{Decision: sidecarv1.Decision_DECISION_ADMITTED, ReservationId: id,
		SendAfterMs: ceilMillis(after), Headers: headersOf(st, nil), HoldMs: s.holds.hold.Milliseconds()}, nil
}

// reserve admits charges now (ReserveAll) or, in wait mode, at the
// earliest time within maxWait (ReserveAt, one charge), and returns what
// to hold, the status for the headers and how long the caller waits.
func (s *Service) reserve(ctx context.Context, charges []spender.Charge, maxWait time.Duration) (*held, spender.Status, time.Duration, error) {
	h := &held{keys: make([]string, len(charges)), costs: make([]ration.Amount, len(charges))}
	for i, c := range charges {
		h.keys[i], h.costs[i] = c.Key, c.Cost
	}
	if maxWait > 0 {
		c := charges[0]
		r, at, err := s.lim.ReserveAt(ctx, c.Key, c.Limits, c.Cost, maxWait)
		if err != nil {
			return nil, spender.Status{}, 0, err
		}
		h.parts = []spender.Reservation{r}
		return h, r.Status(), max(0, at.Sub(s.clock.Now())), nil
	}
	rs, err := s.lim.ReserveAll(ctx, charges)
	if err != nil {
		return nil, spender.Status{}, 0, err
	}
	h.parts = make([]spender.Reservation, rs.Len())
	for i := range h.parts {
		h.parts[i] = rs.Part(i)
	}
	return h, rs.Status(), 0, nil
}

// Settle charges each charge its actual usage (see the proto). An unknown,
// used or expired id is NOT_FOUND; a usage list that does not match the
// charges, or a negative amount, is INVALID_ARGUMENT and settles nothing.
func (s *Service) Settle(_ context.Context, req *sidecarv1.SettleRequest) (*sidecarv1.SettleResponse, error) {
	usage := make([]ration.Amount, len(req.GetUsage()))
	for i, u := range req.GetUsage() {
		usage[i] = leasewire.AmountOf(u)
		if usage[i].Negative() {
			return nil, invalid("usage[%d] has a negative field", i)
		}
	}
	h, err := s.take(req.GetReservationId(), len(usage))
	if err != nil {
		return nil, err
	}
	for i, p := range h.parts {
		p.Settle(usage[i])
	}
	return &sidecarv1.SettleResponse{}, nil
}

// Cancel returns a reservation's whole cost (see the proto).
func (s *Service) Cancel(_ context.Context, req *sidecarv1.CancelRequest) (*sidecarv1.CancelResponse, error) {
	h, err := s.take(req.GetReservationId(), -1)
	if err != nil {
		return nil, err
	}
	for _, p := range h.parts {
		p.Cancel()
	}
	return &sidecarv1.CancelResponse{}, nil
}

// take removes the reservation id from the holds; with parts >= 0 only if
// it has that many charges.
func (s *Service) take(id string, parts int) (*held, error) {
	if len(id) != idLen {
		return nil, notFound()
	}
	h, mismatch := s.holds.takeIf(id, func(h *held) bool { return parts < 0 || len(h.parts) == parts })
	switch {
	case mismatch != nil:
		return nil, invalid("usage has %d amounts for %d charges: one per charge, in the order of the Reserve", parts, len(mismatch.parts))
	case h == nil:
		return nil, notFound()
	}
	return h, nil
}

func notFound() error {
	return connect.NewError(connect.CodeNotFound,
		"sidecar: no such reservation: it was settled or cancelled already, held past its hold time (then settled at its reserved cost), or never issued")
}

// ceilMillis is d in whole milliseconds, rounded up.
func ceilMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
