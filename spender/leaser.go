package spender

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect/v2"
	"golang.org/x/sync/singleflight"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

// maxBatch is the most keys one call carries (the protocol's limit).
const maxBatch = 1024

// leaser is a leased Limiter's link to the allocator: one goroutine that
// makes every call, one at a time, each with (spender id, epoch, sequence),
// retrying a failed call with the same sequence and body until it is
// answered, so the allocator applies it exactly once.
type leaser struct {
	l   *Limiter
	cfg leaseConfig
	log *slog.Logger
	id  string

	// Touched only by the run goroutine.
	epoch uint64
	seq   uint64

	mu      sync.Mutex // guards the fields below
	queue   []*keyState
	urgent  bool
	aheads  []*aheadJob
	flushes []chan struct{}
	closing bool

	wake   chan struct{} // capacity 1: something was queued
	stop   chan struct{} // closed by Close
	done   chan struct{} // closed when run returns
	closed sync.Once

	fallback  atomic.Bool  // the allocator is unreachable
	rtt       atomic.Int64 // smoothed call latency, nanoseconds
	maxActive atomic.Uint32
	sf        singleflight.Group
}

// aheadJob is a ReserveAt waiting for the allocator's reserve-ahead.
type aheadJob struct {
	st      *keyState
	lim     ration.Limits
	cost    ration.Amount
	maxWait time.Duration
	res     chan aheadResult // capacity 1
}

type aheadResult struct {
	r    *leasev1.KeyReservation
	recv time.Time
	ttl  time.Duration
	err  error
}

func newLeaser(l *Limiter, cfg leaseConfig) *leaser {
	lz := &leaser{
		l:     l,
		cfg:   cfg,
		log:   cfg.logger,
		id:    cfg.spenderID,
		epoch: cfg.epoch,
		wake:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	if lz.log == nil {
		lz.log = slog.New(slog.DiscardHandler)
	}
	if lz.id == "" {
		host, _ := os.Hostname()
		lz.id = fmt.Sprintf("%s/%d/%08x", host, os.Getpid(), rand.Uint32())
		if len(lz.id) > 128 {
			lz.id = lz.id[len(lz.id)-128:]
		}
	}
	if lz.epoch == 0 {
		lz.epoch = uint64(time.Now().UnixNano())
	}
	lz.rtt.Store(int64(time.Millisecond))
	if !cfg.manual {
		go lz.run()
	}
	return lz
}

// enqueueLocked puts st in the next Acquire (the caller holds st's shard
// lock). An urgent key skips the batching window.
func (lz *leaser) enqueueLocked(st *keyState, urgent bool) {
	ls := st.ls
	if ls.queued {
		if urgent {
			lz.mu.Lock()
			lz.urgent = true
			lz.mu.Unlock()
			lz.poke()
		}
		return
	}
	ls.queued = true
	lz.mu.Lock()
	lz.queue = append(lz.queue, st)
	lz.urgent = lz.urgent || urgent
	lz.mu.Unlock()
	lz.poke()
}

func (lz *leaser) poke() {
	if lz.cfg.manual {
		return
	}
	select {
	case lz.wake <- struct{}{}:
	default:
	}
}

// attemptTimeout bounds one attempt of a call: ten round trips as measured
// so far, at least 25ms, at most the configured call timeout. A lost
// message is then retried well within the slow-path deadline instead of
// sending every waiting request to the fallback policy.
func (lz *leaser) attemptTimeout() time.Duration {
	return min(lz.cfg.callTimeout, max(25*time.Millisecond, 10*time.Duration(lz.rtt.Load())))
}

// lead is how long before a lease runs out a refresh should start.
func (lz *leaser) lead() time.Duration {
	return 2*time.Duration(lz.rtt.Load()) + lz.cfg.window + 5*time.Millisecond
}

func (lz *leaser) run() {
	defer close(lz.done)
	tick := time.NewTicker(lz.cfg.tick)
	defer tick.Stop()
	for {
		select {
		case <-lz.stop:
			return
		case <-tick.C:
			lz.maintain(false)
		case <-lz.wake:
		}
		if lz.cfg.window > 0 && !lz.isUrgent() {
			// Let other keys join the call, unless a Reserve starts waiting.
			t := time.NewTimer(lz.cfg.window)
		window:
			for {
				select {
				case <-lz.stop:
					t.Stop()
					return
				case <-t.C:
					break window
				case <-lz.wake:
					if lz.isUrgent() {
						t.Stop()
						break window
					}
				}
			}
		}
		lz.round()
	}
}

func (lz *leaser) isUrgent() bool {
	lz.mu.Lock()
	defer lz.mu.Unlock()
	return lz.urgent
}

// round sends what is queued: one Acquire per batch of keys, then one
// ReserveAhead for the waiting ReserveAt calls, then releases Flush callers.
func (lz *leaser) round() {
	lz.mu.Lock()
	keys, aheads, flushes := lz.queue, lz.aheads, lz.flushes
	lz.queue, lz.aheads, lz.flushes, lz.urgent = nil, nil, nil, false
	lz.mu.Unlock()
	for len(keys) > 0 {
		n := min(len(keys), maxBatch)
		lz.acquire(keys[:n])
		keys = keys[n:]
	}
	for len(aheads) > 0 {
		n := min(len(aheads), maxBatch)
		lz.reserveAhead(aheads[:n])
		aheads = aheads[n:]
	}
	for _, f := range flushes {
		close(f)
	}
}

// acquireCall is one Acquire being sent: its body, the keys it carries
// and the channels of the Reserves waiting on them.
type acquireCall struct {
	req   *leasev1.AcquireRequest
	keys  []*keyState
	waits []chan struct{}
	sent  bucket.Instant // first send: leases are counted from here
	start time.Time      // first send, on the real clock (for the deadline)
	fails int
}

// acquire builds one Acquire for keys, sends it until answered and applies
// the answer. Waiters on a key are woken when it is answered, or when the
// allocator is declared unreachable (they then follow the fallback policy).
func (lz *leaser) acquire(keys []*keyState) {
	c := lz.buildAcquire(keys)
	var resp *leasev1.AcquireResponse
	err := lz.call("Acquire", c.wake, func(ctx context.Context, caller *leasev1.Caller) error {
		c.req.Caller = caller
		var err error
		resp, err = lz.cfg.src.Acquire(ctx, c.req)
		return checkAnswer(len(c.req.GetKeys()), len(resp.GetKeys()), err)
	})
	lz.finishAcquire(c, resp, err)
}

func checkAnswer(asked, got int, err error) error {
	if err == nil && asked != got {
		return fmt.Errorf("spender: the allocator answered %d keys for %d", got, asked)
	}
	return err
}

// buildAcquire takes keys' reports and needs into one call body. What goes
// into the body (returns, debts) leaves the keys: it is delivered exactly
// once, with the answer.
func (lz *leaser) buildAcquire(keys []*keyState) *acquireCall {
	inst := lz.l.now()
	c := &acquireCall{req: &leasev1.AcquireRequest{Keys: make([]*leasev1.KeyAcquire, 0, len(keys))},
		keys: keys, waits: make([]chan struct{}, len(keys)), sent: inst, start: time.Now()}
	// Each key's messages come from one block, one allocation per call
	// instead of eight per key: refreshes are most of a leased Limiter's
	// garbage besides the reservations.
	blocks := make([]keyAcquireMsgs, len(keys))
	for i, st := range keys {
		sh := st.sh
		sh.mu.Lock()
		ls := st.ls
		ls.valid(inst)
		ls.updateRate(inst)
		held := add(ls.avail, ls.outstanding)
		m := &blocks[i]
		ka := &m.ka
		ka.Key, ka.Limits = st.key, setLimits(&m.lim, st.lim)
		ka.Want = setAmount(&m.amt[0], ls.want(st.lim, lz.cfg.horizon))
		ka.Need = setAmount(&m.amt[1], ls.need(st.lim))
		ka.SpendRate = setAmount(&m.amt[2], ration.Amount{Requests: int64(ls.rateReq * 60), Tokens: int64(ls.rateTok * 60)})
		ka.Returned = setAmount(&m.amt[3], ls.ret)
		ka.Held = setAmount(&m.amt[4], ration.Amount{Requests: max(0, held.Requests), Tokens: max(0, held.Tokens)})
		ka.Debt = setAmount(&m.amt[5], ls.debt)
		c.req.Keys = append(c.req.Keys, ka)
		ls.ret, ls.debt, ls.waitMax, ls.waitSum = ration.Amount{}, ration.Amount{}, ration.Amount{}, ration.Amount{}
		ls.queued, ls.inCall = false, true
		c.waits[i] = ls.wait
		ls.wait = nil
		sh.mu.Unlock()
	}
	return c
}

// keyAcquireMsgs is one key's part of an Acquire body.
type keyAcquireMsgs struct {
	ka  leasev1.KeyAcquire
	lim leasev1.Limits
	amt [6]leasev1.Amount
}

// wake releases the Reserves waiting on the call's keys, once.
func (c *acquireCall) wake() {
	for i, w := range c.waits {
		if w != nil {
			close(w)
			c.waits[i] = nil
		}
	}
}

// finishAcquire applies the answer to c (or, with err, only ends the call)
// and wakes its waiters.
func (lz *leaser) finishAcquire(c *acquireCall, resp *leasev1.AcquireResponse, err error) {
	recv := lz.l.now()
	expiry := c.sent.Add(time.Duration(resp.GetLeaseTtlUs()) * time.Microsecond)
	for i, st := range c.keys {
		sh := st.sh
		sh.mu.Lock()
		st.ls.inCall = false
		if err == nil {
			lz.applyGrant(st, fromAmount(c.req.GetKeys()[i].GetNeed()), resp.GetKeys()[i], expiry, recv)
		}
		sh.mu.Unlock()
	}
	c.wake()
}

// applyGrant applies one key's answer (the caller holds the shard lock).
func (lz *leaser) applyGrant(st *keyState, need ration.Amount, g *leasev1.KeyGrant, expiry, recv bucket.Instant) {
	ls := st.ls
	ls.hasPending = false
	ls.expiry = expiry
	if recv >= expiry {
		ls.avail = ration.Amount{} // the answer came too late to spend anything
	}
	ls.tooLarge = false
	switch g.GetStatus() {
	case leasev1.GrantStatus_GRANT_STATUS_OK:
		if recv < expiry {
			ls.avail = add(ls.avail, limitedPart(st.lim, fromAmount(g.GetGranted())))
		}
		ls.notBefore = 0
	case leasev1.GrantStatus_GRANT_STATUS_NOT_COVERED:
		ls.notBefore = recv.Add(wireDuration(g.GetRetryAfterUs()))
		ls.shortDim = shortDim(st.lim, need, g.GetSnapshot())
	case leasev1.GrantStatus_GRANT_STATUS_TOO_LARGE:
		ls.tooLarge = true
	}
	if g.GetHeld() != nil {
		ls.trimTo(st.lim, fromAmount(g.GetHeld()))
	}
	ls.setSnapshot(g.GetSnapshot(), recv)
	if a := g.GetActiveSpenders(); a > 0 {
		ls.active = a
		if a > lz.maxActive.Load() {
			lz.maxActive.Store(a)
		}
	}
	if m := lz.cfg.metrics; m != nil {
		r := fromAmount(g.GetReturned())
		m.returnedRequests.Add(float64(r.Requests))
		m.returnedTokens.Add(float64(r.Tokens))
	}
	ls.setLowWater(lz.lead())
}

// wireDuration converts a wait in microseconds from the allocator to a
// Duration: saturating rather than overflowing, and at least 1ms, so that a
// malformed (negative or zero) wait cannot make the key ask again in a loop.
func wireDuration(us int64) time.Duration {
	if us <= 0 {
		return time.Millisecond
	}
	if us > int64(bucket.InfDuration/time.Microsecond) {
		return bucket.InfDuration
	}
	return max(time.Millisecond, time.Duration(us)*time.Microsecond)
}

// shortDim is the dimension whose global bucket falls short of need,
// tokens when both or neither do.
func shortDim(lim ration.Limits, need ration.Amount, sn *leasev1.Snapshot) Dimension {
	if lim.RPM > 0 && need.Requests > sn.GetRequests().GetRemaining() &&
		(lim.TPM == 0 || need.Tokens <= sn.GetTokens().GetRemaining()) {
		return Requests
	}
	return Tokens
}

// reserveAhead sends one ReserveAhead for jobs and hands each its answer.
func (lz *leaser) reserveAhead(jobs []*aheadJob) {
	req := &leasev1.ReserveAheadRequest{Keys: make([]*leasev1.KeyReserve, len(jobs))}
	for i, j := range jobs {
		req.Keys[i] = &leasev1.KeyReserve{Key: j.st.key, Limits: toLimits(j.lim), Cost: toAmount(limitedPart(j.lim, j.cost)),
			MaxWaitUs: int64(j.maxWait / time.Microsecond)}
	}
	var resp *leasev1.ReserveAheadResponse
	failed := false
	err := lz.call("ReserveAhead", func() {
		// At the first failure the waiting callers fall back; a later
		// success cannot be handed to them, so it is given back instead.
		if !failed {
			failed = true
			for _, j := range jobs {
				j.res <- aheadResult{err: errUnreachable}
			}
		}
	}, func(ctx context.Context, c *leasev1.Caller) error {
		req.Caller = c
		var err error
		resp, err = lz.cfg.src.ReserveAhead(ctx, req)
		return checkAnswer(len(req.GetKeys()), len(resp.GetKeys()), err)
	})
	recv := lz.l.timeOf(lz.l.now())
	if failed {
		if err == nil {
			lz.returnOrphans(jobs, resp)
		}
		return
	}
	for i, j := range jobs {
		if err != nil {
			j.res <- aheadResult{err: err}
			continue
		}
		j.res <- aheadResult{r: resp.GetKeys()[i], recv: recv, ttl: time.Duration(resp.GetLeaseTtlUs()) * time.Microsecond}
	}
}

// returnOrphans gives back reservations made for callers that stopped
// waiting: they are returned on the key's next Acquire.
func (lz *leaser) returnOrphans(jobs []*aheadJob, resp *leasev1.ReserveAheadResponse) {
	for i, j := range jobs {
		if resp.GetKeys()[i].GetStatus() != leasev1.GrantStatus_GRANT_STATUS_OK {
			continue
		}
		sh := j.st.sh
		sh.mu.Lock()
		j.st.ls.ret = add(j.st.ls.ret, limitedPart(j.lim, j.cost))
		lz.enqueueLocked(j.st, false)
		sh.mu.Unlock()
	}
}

var errUnreachable = errors.New("spender: allocator unreachable")

// call makes one allocator call, retrying with backoff and jitter until it
// is answered or the Limiter closes. onFail runs after the first failed
// attempt. A stale epoch or sequence moves to a new epoch and resends the
// same body; a rejected argument is not retried.
func (lz *leaser) call(method string, onFail func(), do func(context.Context, *leasev1.Caller) error) error {
	lz.seq++
	backoff := 10 * time.Millisecond
	stale, fails := 0, 0
	first := time.Now()
	for {
		caller := &leasev1.Caller{SpenderId: lz.id, Epoch: lz.epoch, Sequence: lz.seq}
		ctx, cancel := context.WithTimeout(context.Background(), lz.attemptTimeout())
		start := time.Now()
		err := do(ctx, caller)
		cancel()
		if m := lz.cfg.metrics; m != nil {
			result := "ok"
			if err != nil {
				result = "error"
			}
			m.calls.WithLabelValues(method, result).Inc()
			if err == nil {
				m.callSeconds.WithLabelValues(method).Observe(time.Since(start).Seconds())
			}
		}
		if err == nil {
			d := time.Since(start)
			lz.rtt.Store((lz.rtt.Load()*7 + int64(d)) / 8)
			lz.setFallback(false, nil)
			return nil
		}
		switch connect.CodeOf(err) {
		case connect.CodeInvalidArgument:
			lz.log.Error("spender: allocator rejected a call; not retrying", "method", method, "err", err)
			onFail()
			return err
		case connect.CodeFailedPrecondition:
			// Our epoch or sequence is stale (another incarnation with our
			// id, or the allocator lost our session's tail): start a new
			// epoch. Holdings of the old one simply expire.
			if stale++; stale > 3 {
				lz.log.Error("spender: allocator keeps refusing our epoch; giving up the call", "method", method, "err", err)
				onFail()
				return err
			}
			lz.epoch = max(lz.epoch+1, uint64(time.Now().UnixNano()))
			lz.seq = 1
			lz.log.Warn("spender: allocator refused our epoch or sequence; starting a new epoch", "method", method, "epoch", lz.epoch, "err", err)
			continue
		}
		// One lost reply is not an outage: the retry usually answers within
		// the slow-path deadline. Declare the allocator unreachable (and
		// let waiters fall back) after three failed attempts or once the
		// call has been failing for longer than the deadline.
		if fails++; fails >= 3 || time.Since(first) >= lz.cfg.slowDeadline {
			onFail()
			lz.setFallback(true, err)
		}
		jitter := time.Duration(rand.Int64N(int64(backoff)/2 + 1))
		t := time.NewTimer(backoff/2 + jitter)
		select {
		case <-lz.stop:
			t.Stop()
			return err
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// setFallback records whether the allocator is reachable, logging and
// counting each switch once.
func (lz *leaser) setFallback(on bool, err error) {
	if lz.fallback.Swap(on) == on {
		return
	}
	if m := lz.cfg.metrics; m != nil {
		v := 0.0
		if on {
			v = 1
		}
		m.fallback.Set(v)
	}
	if on {
		lz.log.Warn("spender: allocator unreachable; spending valid leases, then falling back", "policy", lz.cfg.policy.String(), "err", err)
	} else {
		lz.log.Info("spender: allocator reachable again; fallback admissions are reported as debt")
	}
}

// maintain scans every key: a lease about to expire is renewed for a key in
// use and given back for an idle one; debts and returns waiting on an idle
// key are sent. With force, every key with anything to report is sent.
func (lz *leaser) maintain(force bool) {
	now := lz.l.now()
	soon := now.Add(2*lz.cfg.tick + lz.lead())
	var held int
	for i := range lz.l.shards {
		sh := &lz.l.shards[i]
		sh.mu.Lock()
		held += sh.n
		for _, slot := range sh.keys.slots {
			for st := slot.st; st != nil; st = st.next {
				ls := st.ls
				if ls == nil || ls.queued {
					continue
				}
				ls.valid(now)
				send := force && (ls.debt != ration.Amount{} || ls.ret != ration.Amount{} || ls.avail != ration.Amount{})
				if ls.avail != (ration.Amount{}) && ls.expiry <= soon {
					if now.Sub(ls.lastUse) > lz.cfg.horizon {
						ls.ret = add(ls.ret, ls.avail) // idle: give it back before it is lost
						ls.avail = ration.Amount{}
					}
					send = true
				}
				if ls.debt != (ration.Amount{}) || ls.ret != (ration.Amount{}) {
					send = send || now.Sub(ls.lastUse) > lz.cfg.tick || lz.fallback.Load()
				}
				if send {
					lz.enqueueLocked(st, false)
				}
			}
		}
		sh.mu.Unlock()
	}
	if m := lz.cfg.metrics; m != nil {
		m.keysHeld.Set(float64(held))
	}
}

// flush sends everything waiting to be reported and waits for the answer.
func (lz *leaser) flush(ctx context.Context) error {
	lz.maintain(true)
	ch := make(chan struct{})
	lz.mu.Lock()
	if lz.closing {
		lz.mu.Unlock()
		return ErrClosed
	}
	lz.flushes = append(lz.flushes, ch)
	lz.urgent = true
	lz.mu.Unlock()
	lz.poke()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-lz.done:
		return ErrClosed
	}
}

// close stops the goroutine and gives back every unspent lease.
func (lz *leaser) close(ctx context.Context) error {
	first := false
	lz.closed.Do(func() {
		first = true
		lz.mu.Lock()
		lz.closing = true
		lz.mu.Unlock()
		close(lz.stop)
		if lz.cfg.manual {
			close(lz.done)
		}
	})
	select {
	case <-lz.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if !first {
		return nil
	}
	return lz.release(ctx)
}

// release sends one Release with every key's unspent lease and debt.
func (lz *leaser) release(ctx context.Context) error {
	now := lz.l.now()
	req := &leasev1.ReleaseRequest{}
	for i := range lz.l.shards {
		sh := &lz.l.shards[i]
		sh.mu.Lock()
		for _, slot := range sh.keys.slots {
			for st := slot.st; st != nil; st = st.next {
				ls := st.ls
				if ls == nil {
					continue
				}
				ls.valid(now)
				ret := add(ls.ret, ls.avail)
				if ret == (ration.Amount{}) && ls.debt == (ration.Amount{}) {
					continue
				}
				req.Keys = append(req.Keys, &leasev1.KeyRelease{Key: st.key, Limits: toLimits(st.lim),
					Returned: toAmount(ret), Debt: toAmount(ls.debt)})
				ls.avail, ls.ret, ls.debt = ration.Amount{}, ration.Amount{}, ration.Amount{}
			}
		}
		sh.mu.Unlock()
	}
	lz.seq++
	backoff := 10 * time.Millisecond
	for {
		c := &leasev1.Caller{SpenderId: lz.id, Epoch: lz.epoch, Sequence: lz.seq}
		req.Caller = c
		cctx, cancel := context.WithTimeout(ctx, lz.cfg.callTimeout)
		_, err := lz.cfg.src.Release(cctx, req)
		cancel()
		if m := lz.cfg.metrics; m != nil {
			result := "ok"
			if err != nil {
				result = "error"
			}
			m.calls.WithLabelValues("Release", result).Inc()
		}
		switch connect.CodeOf(err) {
		case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeUnauthenticated, connect.CodePermissionDenied:
			// Retrying cannot help: the holdings expire on their own.
			return fmt.Errorf("spender: releasing leases: %w", err)
		}
		if err == nil {
			return nil
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("spender: releasing leases: %w (last error: %w)", ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}
