package spender

import (
	"errors"

	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

// ErrLeasePending is returned by Reserve and ReserveAt of a Limiter built
// WithManualLeasing when the key's lease cannot cover the cost: the key is
// queued for the next call. Deliver that call, then ask again. Once the
// key has waited longer than the slow-path deadline (on the Limiter's
// clock), the fallback policy decides instead.
var ErrLeasePending = errors.New("spender: lease pending")

// WithManualLeasing makes a leased Limiter run no goroutine and never
// block: its owner moves the allocator calls with NextCall, Deliver and
// Maintain, on whatever clock it likes. It exists for simulators that run
// the real spender under virtual time; a gateway wants the default. Wait
// mode is not available: ReserveAt behaves like Reserve.
func WithManualLeasing() Option {
	return optionFunc(func(c *config) { c.lease.manual = true })
}

// Call is one Acquire of a Limiter built WithManualLeasing.
type Call struct {
	c *acquireCall
}

// Request returns the call's body, caller included. After a failure send
// the same body again: the allocator answers a retry from its record.
func (c *Call) Request() *leasev1.AcquireRequest { return c.c.req }

// NextCall builds the Acquire for every queued key, or returns nil when
// nothing is queued. Only one call may be outstanding: deliver it first.
func (l *Limiter) NextCall() *Call {
	lz := l.lz
	lz.mu.Lock()
	keys := lz.queue
	if len(keys) > maxBatch {
		keys, lz.queue = keys[:maxBatch], keys[maxBatch:]
	} else {
		lz.queue = nil
	}
	lz.urgent = false
	lz.mu.Unlock()
	if len(keys) == 0 {
		return nil
	}
	c := lz.buildAcquire(keys)
	lz.seq++
	c.req.Caller = &leasev1.Caller{SpenderId: lz.id, Epoch: lz.epoch, Sequence: lz.seq}
	return &Call{c: c}
}

// Deliver hands the allocator's answer to the Limiter and reports whether
// the call is over. With a non-nil err the answer never came: the call
// stays outstanding and must be sent again; after three failures, or once
// the call is older than the slow-path deadline on the Limiter's clock,
// the allocator counts as unreachable and the fallback policy applies
// until a call is answered.
func (l *Limiter) Deliver(c *Call, resp *leasev1.AcquireResponse, err error) bool {
	lz := l.lz
	if err = checkAnswer(len(c.c.req.GetKeys()), len(resp.GetKeys()), err); err != nil {
		c.c.fails++
		now := l.now()
		if c.c.fails >= 3 || now.Sub(c.c.sent) >= lz.cfg.slowDeadline {
			lz.setFallback(true, err)
		}
		return false
	}
	lz.setFallback(false, nil)
	lz.finishAcquire(c.c, resp, nil)
	return true
}

// Maintain runs the periodic scan that the background goroutine would:
// leases about to expire are renewed or given back, waiting debts and
// returns are queued for the next call.
func (l *Limiter) Maintain() { l.lz.maintain(false) }
