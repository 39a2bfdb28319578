package spender

import (
	"context"
	"fmt"
	"hash/maphash"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// Charge is one budget a request is charged to: a key's own limits, its
// team's, a key and model pair, a model-wide cap. Budgets share the
// Limiter's key space (and, leased, the allocator's): the gateway names
// them so that they do not collide, for example "team:acme".
type Charge struct {
	Key    string        // the budget's id; rules as for Reserve's key
	Limits ration.Limits // the budget's limits, sent with every call as for Reserve
	// Cost is what the request costs this budget. What its Tokens count
	// (all tokens, input or output tokens) is the budget's own meaning:
	// the Limiter only keeps the buckets.
	Cost ration.Amount
}

// Reservations is what ReserveAll admitted: one Reservation per charge, in
// the order of the charges. Like a Reservation, exactly one of Settle and
// Cancel counts. It is safe for concurrent use.
type Reservations struct {
	parts []Reservation
	buf   [3]Reservation // parts, for up to three charges: one allocation less
}

// newReservations returns Reservations for n charges.
func newReservations(n int) *Reservations {
	rs := &Reservations{}
	if n <= len(rs.buf) {
		rs.parts = rs.buf[:n]
	} else {
		rs.parts = make([]Reservation, n)
	}
	return rs
}

// Len returns the number of charges.
func (rs *Reservations) Len() int { return len(rs.parts) }

// Part returns charge i's reservation.
func (rs *Reservations) Part(i int) Reservation { return rs.parts[i] }

// Settle settles charge i with actual[i], as Reservation.Settle does. It
// needs one actual per charge; otherwise it returns an error wrapping
// ErrInvalidCharges and settles nothing.
func (rs *Reservations) Settle(actual []ration.Amount) error {
	if len(actual) != len(rs.parts) {
		return fmt.Errorf("%w: %d actual amounts for %d charges", ErrInvalidCharges, len(actual), len(rs.parts))
	}
	for i, r := range rs.parts {
		r.Settle(actual[i])
	}
	return nil
}

// Cancel returns every charge's whole cost.
func (rs *Reservations) Cancel() {
	for _, r := range rs.parts {
		r.Cancel()
	}
}

// Status returns, per dimension, the most restrictive budget right after
// the reservation: the one with the fewest units remaining (the smaller
// limit on a tie). A dimension no budget limits reads 0.
func (rs *Reservations) Status() Status {
	var out Status
	for _, r := range rs.parts {
		s := r.Status()
		if s.LimitRequests > 0 && (out.LimitRequests == 0 || s.RemainingRequests < out.RemainingRequests ||
			s.RemainingRequests == out.RemainingRequests && s.LimitRequests < out.LimitRequests) {
			out.LimitRequests, out.RemainingRequests, out.ResetRequests = s.LimitRequests, s.RemainingRequests, s.ResetRequests
		}
		if s.LimitTokens > 0 && (out.LimitTokens == 0 || s.RemainingTokens < out.RemainingTokens ||
			s.RemainingTokens == out.RemainingTokens && s.LimitTokens < out.LimitTokens) {
			out.LimitTokens, out.RemainingTokens, out.ResetTokens = s.LimitTokens, s.RemainingTokens, s.ResetTokens
		}
	}
	return out
}

// ReserveAll admits a request charged to several budgets, all or nothing:
// every charge's cost now, or none, with a *RejectError whose Key names
// the budget that waits longest and whose RetryAfter is the earliest time
// every budget covers its cost (the longest of their waits). A charge
// whose cost can never fit is refused with Oversize, naming it. An
// unlimited charge is admitted and keeps nothing.
//
// A leased Limiter admits locally when every budget's lease covers its
// charge; otherwise it asks the allocator for those that do not, in one
// call, and decides again when the answer arrives, as Reserve does for one
// key. Wait mode (ReserveAt) takes one budget.
//
// Bad input changes nothing: no charges, more than ration.MaxBudgets, or a
// key charged twice is an error wrapping ErrInvalidCharges; a bad key,
// cost or limits, ErrInvalidKey, ErrInvalidCost or ErrInvalidLimits.
func (l *Limiter) ReserveAll(ctx context.Context, charges []Charge) (*Reservations, error) {
	if err := checkCharges(charges); err != nil {
		return nil, err
	}
	if l.lz != nil {
		return l.drv.reserveAll(ctx, charges)
	}
	now := l.now()
	var ks chargeLocks
	if err := l.lockCharges(&ks, charges, now); err != nil {
		return nil, err
	}
	defer ks.unlock()
	var worst *RejectError
	for i, c := range charges {
		st := ks.st[i]
		if st == nil {
			continue
		}
		st.Advance(now)
		w, dim, fits := st.Wait(c.Cost)
		if !fits {
			return nil, &RejectError{Status: st.status(), Dimension: Dimension(dim), Oversize: true, Cost: c.Cost, Key: c.Key}
		}
		if w > 0 && (worst == nil || w > worst.RetryAfter) {
			worst = &RejectError{RetryAfter: w, Status: st.status(), Dimension: Dimension(dim), Cost: c.Cost, Key: c.Key}
		}
	}
	if worst != nil {
		return nil, worst
	}
	rs := newReservations(len(charges))
	each := make([]reservation, len(charges)) // one allocation for every part
	for i, c := range charges {
		st := ks.st[i]
		if st == nil {
			rs.parts[i] = unlimited{}
			continue
		}
		st.admit(&each[i], c.Cost)
		rs.parts[i] = &each[i]
	}
	return rs, nil
}

// reserveAllLeased is ReserveAll on a leased Limiter at now, without
// waiting: judgeLocked's rules for every charge first, then either one
// refusal (the longest wait), the allocator asked for every budget that
// needs it (a waiter to ask again with), or every charge admitted.
func (l *Limiter) reserveAllLeased(now bucket.Instant, charges []Charge, w *waiter) (*Reservations, *waiter, error) {
	lz, m := l.lz, l.lz.cfg.metrics
	var ks chargeLocks
	if err := l.lockCharges(&ks, charges, now); err != nil {
		return nil, nil, err
	}
	defer ks.unlock()
	var verdicts [ration.MaxBudgets]verdict
	var worst *RejectError
	closed := false // the worst refusal is the FailClosed policy's
	for i, c := range charges {
		st := ks.st[i]
		if st == nil {
			continue
		}
		v, rej, err := lz.judgeLocked(st, c.Cost, now, w)
		if err != nil {
			return nil, nil, err
		}
		byPolicy := false
		if v == fallback {
			if rej = lz.fallbackCheckLocked(st, c.Cost, now); rej != nil {
				v, byPolicy = refuse, true
			}
		}
		if v == refuse {
			rej.Key = c.Key
			if rej.Oversize {
				m.reject(rej)
				return nil, nil, rej
			}
			if worst == nil || rej.RetryAfter > worst.RetryAfter {
				worst, closed = rej, byPolicy && lz.cfg.policy == FailClosed
			}
		}
		verdicts[i] = v
	}
	if worst != nil {
		if closed {
			m.failClosed()
		} else {
			m.reject(worst)
		}
		for i, c := range charges {
			if verdicts[i] == refuse {
				ks.st[i].lk.Refuse(c.Cost, now) // demand the budget did not meet
			}
		}
		return nil, nil, worst
	}
	var ready <-chan struct{}
	for i, c := range charges {
		if verdicts[i] == ask {
			if ch := lz.askLocked(ks.st[i], c.Cost, now); ready == nil {
				ready = ch
			}
		}
	}
	if ready != nil {
		if w == nil {
			w = lz.newWaiter(nil, now, nil)
		}
		w.ready = ready
		return nil, w, nil
	}
	path := pathLocal
	if w != nil {
		path = pathSlow
	}
	rs := newReservations(len(charges))
	for i, c := range charges {
		switch verdicts[i] {
		case admitLease:
			rs.parts[i] = lz.admitLocked(ks.st[i], c.Cost, now, path)
		case fallback:
			// Checked above under the same locks: it admits.
			rs.parts[i], _ = lz.fallbackLocked(ks.st[i], c.Cost, now)
		default:
			rs.parts[i] = unlimited{}
		}
	}
	return rs, nil, nil
}

// checkCharges validates what ReserveAll can check before taking a lock.
func checkCharges(charges []Charge) error {
	if len(charges) == 0 || len(charges) > ration.MaxBudgets {
		return fmt.Errorf("%w: %d charges, want 1 to %d", ErrInvalidCharges, len(charges), ration.MaxBudgets)
	}
	for i, c := range charges {
		if err := ration.ValidKey(c.Key); err != nil {
			return fmt.Errorf("%w: charge %d: %w", ErrInvalidKey, i, err)
		}
		if c.Cost.Requests < 0 || c.Cost.Tokens < 0 {
			return fmt.Errorf("%w: charge %d: %+v has a negative field", ErrInvalidCost, i, c.Cost)
		}
		if c.Limits.Unlimited() {
			if err := c.Limits.Validate(); err != nil {
				return fmt.Errorf("charge %d: %w", i, err)
			}
		}
		for j := range i {
			if charges[j].Key == c.Key {
				return fmt.Errorf("%w: charges %d and %d name the same key", ErrInvalidCharges, j, i)
			}
		}
	}
	return nil
}

// chargeLocks holds the shards of a ReserveAll's charges, locked, and each
// limited charge's key state (nil for an unlimited charge).
type chargeLocks struct {
	st     [ration.MaxBudgets]*keyState
	shards [ration.MaxBudgets]*shard // locked, in index order
	n      int
}

// lockCharges locks into ks the shards of charges in shard order (so that
// two ReserveAlls cannot deadlock), sweeps those that are due, and looks
// up (or makes) each limited charge's state. On error nothing is locked.
func (l *Limiter) lockCharges(ks *chargeLocks, charges []Charge, now bucket.Instant) error {
	var hs [ration.MaxBudgets]uint64
	var idx [ration.MaxBudgets]uint64
	n := 0
	for i, c := range charges {
		if c.Limits.Unlimited() {
			continue
		}
		hs[i] = maphash.String(l.seed, c.Key)
		s := hs[i] & l.mask
		j := n
		for j > 0 && idx[j-1] > s { // insertion sort; duplicates kept once
			j--
		}
		if j > 0 && idx[j-1] == s {
			continue
		}
		copy(idx[j+1:n+1], idx[j:n])
		idx[j] = s
		n++
	}
	for _, s := range idx[:n] {
		sh := &l.shards[s]
		sh.mu.Lock()
		if now >= sh.sweepAt || sh.keys.n >= sh.sweepLen {
			sh.sweepLocked(now)
		}
		ks.shards[ks.n] = sh
		ks.n++
	}
	for i, c := range charges {
		if c.Limits.Unlimited() {
			continue
		}
		st, err := l.shards[hs[i]&l.mask].lookupLocked(hs[i], c.Key, c.Limits, now)
		if err != nil {
			ks.unlock()
			return fmt.Errorf("charge %d: %w", i, err)
		}
		ks.st[i] = st
	}
	return nil
}

func (ks *chargeLocks) unlock() {
	for _, sh := range ks.shards[:ks.n] {
		sh.mu.Unlock()
	}
	ks.n = 0
}
