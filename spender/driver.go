package spender

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect/v2"

	"github.com/rationhq/ration"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

// driver moves a leased Limiter's lease state machine: one goroutine sends
// the calls the machine asks for over the LeaseSource and sleeps, on the
// Limiter's Clock, until the machine next needs to run; a Reserve that has
// to wait for the allocator blocks here, on the machine's waiter. A
// LeaseSource that drives the machine itself (the simulator) gets no
// goroutine.
type driver struct {
	l     *Limiter
	lz    *leaser
	src   LeaseSource
	clock ration.Clock

	poke      chan struct{} // capacity 1: the machine has something new
	stop      chan struct{} // closed by close
	done      chan struct{} // closed when the goroutine returns
	closeOnce sync.Once
}

func startDriver(l *Limiter, src LeaseSource) *driver {
	d := &driver{l: l, lz: l.lz, src: src, clock: l.clock,
		poke: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if ds, ok := src.(DrivingSource); ok {
		close(d.done)
		ds.Drive(&Machine{d})
		return d
	}
	d.lz.notify = d.wake
	go d.run()
	return d
}

func (d *driver) wake() {
	select {
	case d.poke <- struct{}{}:
	default:
	}
}

func (d *driver) run() {
	defer close(d.done)
	for {
		now := d.l.now()
		d.lz.tick(now)
		if c := d.lz.nextCall(now); c != nil {
			d.send(c)
			continue
		}
		t := d.clock.AfterFunc(d.lz.nextWake(now).Sub(now), d.wake)
		select {
		case <-d.stop:
			t.Stop()
			return
		case <-d.poke:
		}
		t.Stop()
	}
}

// send makes one attempt of c and hands the machine its outcome.
func (d *driver) send(c *LeaseCall) {
	ctx, cancel := context.WithCancelCause(context.Background())
	t := d.clock.AfterFunc(d.lz.attemptTimeout(), func() { cancel(ErrAttemptTimedOut) })
	start := d.l.now()
	var ahead *leasev1.ReserveAheadResponse
	var acquire *leasev1.AcquireResponse
	var err error
	if c.ahead != nil {
		ahead, err = d.src.ReserveAhead(ctx, c.ahead)
	} else {
		acquire, err = d.src.Acquire(ctx, c.acquire)
	}
	t.Stop()
	if err != nil && errors.Is(context.Cause(ctx), ErrAttemptTimedOut) {
		err = fmt.Errorf("%w after %v: %w", ErrAttemptTimedOut, d.l.now().Sub(start), err)
	}
	cancel(nil)
	now := d.l.now()
	d.lz.cfg.metrics.call(c.method(), err, now.Sub(start))
	if c.ahead != nil {
		d.lz.deliverAhead(now, c, ahead, err)
	} else {
		d.lz.deliverAcquire(now, c, acquire, err)
	}
}

// reserve is Reserve and ReserveAt on a leased Limiter: the machine
// decides; when it must ask the allocator first, the caller waits for the
// answer (or the slow-path deadline, on the Clock) and asks again.
func (d *driver) reserve(ctx context.Context, key string, lim ration.Limits, c ration.Amount, maxWait time.Duration, ahead bool) (Reservation, time.Time, error) {
	var w *waiter
	for {
		r, at, next, err := d.l.reserveLeased(d.l.now(), key, lim, c, maxWait, ahead, w)
		if next == nil {
			return r, at, err
		}
		w = next
		if err := d.await(ctx, w); err != nil {
			return nil, time.Time{}, err
		}
	}
}

// reserveAll is ReserveAll on a leased Limiter, waiting as reserve does.
func (d *driver) reserveAll(ctx context.Context, charges []Charge) (*Reservations, error) {
	var w *waiter
	for {
		rs, next, err := d.l.reserveAllLeased(d.l.now(), charges, w)
		if next == nil {
			return rs, err
		}
		w = next
		if err := d.await(ctx, w); err != nil {
			return nil, err
		}
	}
}

// await blocks until w is ready (the call carrying its key ended), its
// deadline passes, ctx ends (its error) or the Limiter closes (ErrClosed).
func (d *driver) await(ctx context.Context, w *waiter) error {
	deadline := make(chan struct{})
	t := d.clock.AfterFunc(w.deadline.Sub(d.l.now()), func() { close(deadline) })
	defer t.Stop()
	select {
	case <-w.ready:
	case <-deadline:
	case <-ctx.Done():
		return ctx.Err()
	case <-d.stop:
		return ErrClosed
	}
	return nil
}

// flush sends everything waiting to be reported and waits for the answer.
func (d *driver) flush(ctx context.Context) error {
	ch, err := d.lz.flush(d.l.now())
	if err != nil {
		return err
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-d.stop:
		return ErrClosed
	}
}

// close stops the goroutine and gives back every unspent lease: one
// Release, retried with backoff until ctx ends or the allocator refuses it
// for good (the holdings then expire on their own).
func (d *driver) close(ctx context.Context) error {
	first := false
	d.closeOnce.Do(func() {
		first = true
		close(d.stop)
	})
	select {
	case <-d.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if !first {
		return nil
	}
	req := d.lz.release(d.l.now())
	if err := d.lz.ready(); errors.Is(err, ErrDuplicateSpender) || errors.Is(err, ErrSpenderRefused) {
		return fmt.Errorf("spender: leases not returned (they expire at the allocator): %w", err)
	}
	backoff := 10 * time.Millisecond
	for {
		cctx, cancel := context.WithCancel(ctx)
		t := d.clock.AfterFunc(d.lz.cfg.tuning.CallTimeout, cancel)
		start := d.l.now()
		_, err := d.src.Release(cctx, req)
		t.Stop()
		cancel()
		d.lz.cfg.metrics.call("Release", err, d.l.now().Sub(start))
		switch connect.CodeOf(err) {
		case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeUnauthenticated, connect.CodePermissionDenied:
			return fmt.Errorf("spender: releasing leases: %w", err)
		}
		if err == nil {
			return nil
		}
		retry := make(chan struct{})
		t = d.clock.AfterFunc(backoff, func() { close(retry) })
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("spender: releasing leases: %w (last error: %w)", ctx.Err(), err)
		case <-retry:
		}
		backoff = min(2*backoff, time.Second)
	}
}
