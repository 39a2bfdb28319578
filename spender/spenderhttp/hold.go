package spenderhttp

import (
	"context"
	"fmt"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender"
)

// MultiReserver is a limiter that can charge a request to several budgets
// at once, all or nothing (*spender.Limiter is one). Middleware needs it
// for a Principal with Budgets.
type MultiReserver interface {
	ReserveAll(ctx context.Context, charges []spender.Charge) (*spender.Reservations, error)
}

// spent is what a request used, in the terms budgets meter.
type spent struct {
	requests      int64
	input, output int64 // prompt and completion tokens
	total         int64 // at least input + output
}

// tokens is what meter m counts of s.
func (s spent) tokens(m Meter) int64 {
	switch m {
	case InputTokens:
		return s.input
	case OutputTokens:
		return s.output
	}
	return s.total
}

// spentOf is a request of prompt input tokens and output completion
// tokens, saturating.
func spentOf(requests, input, output int64) spent {
	return spent{requests: requests, input: input, output: output, total: satAdd(input, output)}
}

// budgetRef is one budget a request was charged to, for headers and
// refusals.
type budgetRef struct {
	key    string
	scope  string
	meter  Meter
	window time.Duration
}

// refOf is the budget of p whose key is key: a Budget's, or the key's own
// ("" too: a single-budget refusal names none).
func refOf(p Principal, key string) budgetRef {
	for _, b := range p.Budgets {
		if b.Key == key {
			return budgetRef{key: b.Key, scope: b.Scope, meter: b.Meter, window: b.Limits.Period()}
		}
	}
	return budgetRef{key: p.KeyID, scope: "key", meter: TotalTokens, window: p.Limits.Period()}
}

// hold is what the stage reserved for a request: the key's budget alone
// (one), or every budget of the Principal (all, with refs in charge
// order).
type hold struct {
	one  spender.Reservation
	all  *spender.Reservations
	refs []budgetRef
}

// settle charges what the request used to every budget, each its meter's
// tokens.
func (h *hold) settle(s spent) {
	if h.all == nil {
		h.one.Settle(ration.Amount{Requests: s.requests, Tokens: s.total})
		return
	}
	actual := make([]ration.Amount, len(h.refs))
	for i, b := range h.refs {
		actual[i] = ration.Amount{Requests: s.requests, Tokens: s.tokens(b.meter)}
	}
	_ = h.all.Settle(actual) // one actual per charge: cannot fail
}

func (h *hold) cancel() {
	if h.all == nil {
		h.one.Cancel()
		return
	}
	h.all.Cancel()
}

// views returns each budget's state right after the reservation.
func (h *hold) views() []budgetView {
	if h.all == nil {
		return []budgetView{{budgetRef: h.refs[0], st: h.one.Status()}}
	}
	v := make([]budgetView, len(h.refs))
	for i, b := range h.refs {
		v[i] = budgetView{budgetRef: b, st: h.all.Part(i).Status()}
	}
	return v
}

// reserve reserves est for p: its key's Limits alone with Reserve, or,
// when p has Budgets (its model's included), every budget with
// ReserveAll.
func (s *stage) reserve(ctx context.Context, p Principal, est estimateResult) (*hold, error) {
	key := refOf(p, p.KeyID)
	if len(p.Budgets) == 0 {
		r, err := s.l.Reserve(ctx, p.KeyID, p.Limits, est.cost())
		if err != nil {
			return nil, err
		}
		return &hold{one: r, refs: []budgetRef{key}}, nil
	}
	mr, ok := s.l.(MultiReserver)
	if !ok {
		return nil, fmt.Errorf("spenderhttp: the principal has %d budgets and the limiter (%T) cannot charge several", len(p.Budgets), s.l)
	}
	want := spentOf(1, est.prompt, est.completion)
	refs := make([]budgetRef, 0, 1+len(p.Budgets))
	charges := make([]spender.Charge, 0, 1+len(p.Budgets))
	if !p.Limits.Unlimited() {
		refs = append(refs, key)
		charges = append(charges, spender.Charge{Key: p.KeyID, Limits: p.Limits, Cost: est.cost()})
	}
	for _, b := range p.Budgets {
		refs = append(refs, refOf(p, b.Key))
		charges = append(charges, spender.Charge{Key: b.Key, Limits: b.Limits, Cost: ration.Amount{Requests: 1, Tokens: want.tokens(b.Meter)}})
	}
	rs, err := mr.ReserveAll(ctx, charges)
	if err != nil {
		return nil, err
	}
	return &hold{all: rs, refs: refs}, nil
}
