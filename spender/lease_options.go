package spender

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

// LeaseSource is where a leased Limiter gets its budget: the allocator's
// three calls, as the generated connect client and the allocator's own
// service both provide them (see DialAllocator for the network client;
// the allocator package's service value is the in-process one). Calls are
// made one at a time, each carrying (spender id, epoch, sequence); a call
// that failed is retried with the same sequence and body until it is
// answered, so the allocator applies it exactly once.
type LeaseSource interface {
	Acquire(context.Context, *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error)
	ReserveAhead(context.Context, *leasev1.ReserveAheadRequest) (*leasev1.ReserveAheadResponse, error)
	Release(context.Context, *leasev1.ReleaseRequest) (*leasev1.ReleaseResponse, error)
}

// FallbackPolicy says what a leased Limiter does for a key whose lease is
// spent or expired while the allocator cannot be reached.
type FallbackPolicy uint8

const (
	// FallbackShare admits from a local bucket pair at the key's last known
	// share: per dimension, the spender's own refill share plus an even part,
	// among the spenders the allocator last reported active on the key, of
	// the rate no share took (without shares, the limits divided by that
	// count; for a key never seen, by the count seen on any key). While
	// every spender does this the shares sum to the limit. Admissions are
	// reported to the allocator as debt on recovery.
	FallbackShare FallbackPolicy = iota
	// FailClosed rejects until the allocator answers again.
	FailClosed
	// FailOpen admits everything until the allocator answers again, and
	// reports it as debt on recovery.
	FailOpen
)

// String names the policy: "share", "closed" or "open".
func (p FallbackPolicy) String() string {
	switch p {
	case FallbackShare:
		return "share"
	case FailClosed:
		return "closed"
	case FailOpen:
		return "open"
	}
	return "unknown"
}

type leaseConfig struct {
	leased    bool // WithLeases was given
	src       LeaseSource
	spenderID string
	epoch     uint64
	tuning    LeaseTuning
	policy    FallbackPolicy
	logger    *slog.Logger
	metrics   *Metrics
}

func defaultLeaseConfig() leaseConfig {
	return leaseConfig{tuning: DefaultLeaseTuning(), policy: FallbackShare}
}

// LeaseTuning holds a leased Limiter's timing knobs, all in clock time.
// Start from DefaultLeaseTuning and change what you need; New checks every
// field.
type LeaseTuning struct {
	// SlowPathDeadline bounds how long a Reserve whose lease cannot cover
	// its cost waits for the allocator before the fallback policy decides.
	// Positive; default 50ms.
	SlowPathDeadline time.Duration
	// BatchWindow is how long a background refresh waits for other keys to
	// join its Acquire call; a Reserve that is waiting skips it. 0 sends at
	// once; below SlowPathDeadline; default 1ms.
	BatchWindow time.Duration
	// Horizon is how much of a key's observed spend a lease should cover:
	// a refresh asks for spend rate × Horizon. Longer means fewer allocator
	// calls per request and more budget parked at this spender. Positive;
	// default 2s.
	Horizon time.Duration
	// MaintenanceInterval is how often the Limiter looks for leases about
	// to expire (to renew or return them), debts and returns waiting to be
	// sent, and a way out of fallback. Positive; default 250ms.
	MaintenanceInterval time.Duration
	// CallTimeout caps how long one attempt of an allocator call may take
	// before it is retried (with backoff, same sequence and body). Within
	// the cap an attempt waits ten measured round trips, at least 25ms.
	// Positive; default 2s.
	CallTimeout time.Duration
}

// DefaultLeaseTuning returns the defaults of every LeaseTuning field.
func DefaultLeaseTuning() LeaseTuning {
	return LeaseTuning{
		SlowPathDeadline:    50 * time.Millisecond,
		BatchWindow:         time.Millisecond,
		Horizon:             2 * time.Second,
		MaintenanceInterval: 250 * time.Millisecond,
		CallTimeout:         2 * time.Second,
	}
}

// Validate reports whether every field is in range; the error wraps
// ErrInvalidOption and names the field.
func (t LeaseTuning) Validate() error {
	bad := func(field string, d time.Duration, want string) error {
		return fmt.Errorf("%w: WithLeaseTuning: %s is %v, want %s", ErrInvalidOption, field, d, want)
	}
	switch {
	case t.SlowPathDeadline <= 0:
		return bad("SlowPathDeadline", t.SlowPathDeadline, "a positive duration")
	case t.BatchWindow < 0 || t.BatchWindow >= t.SlowPathDeadline:
		return bad("BatchWindow", t.BatchWindow, "0 or more and below SlowPathDeadline")
	case t.Horizon <= 0:
		return bad("Horizon", t.Horizon, "a positive duration")
	case t.MaintenanceInterval <= 0:
		return bad("MaintenanceInterval", t.MaintenanceInterval, "a positive duration")
	case t.CallTimeout <= 0:
		return bad("CallTimeout", t.CallTimeout, "a positive duration")
	}
	return nil
}

// WithLeases makes the Limiter spend leases from src instead of keeping
// the whole budget in process: every key's budget is global, held by the
// allocator, and this Limiter admits only what it was granted. The surface
// (Reserve, ReserveAt, Settle, Cancel, Status, RejectError) is unchanged.
// A leased Limiter runs a background goroutine; call Close to return its
// leases and stop it.
func WithLeases(src LeaseSource) Option {
	return optionFunc(func(c *config) { c.lease.leased, c.lease.src = true, src })
}

// WithSpenderID names this spender to the allocator (1 to 128 bytes of
// UTF-8). The default is the host name, the process id and a random
// suffix. Holdings are tracked per spender id and epoch, so two processes
// must not share one.
func WithSpenderID(id string) Option {
	return leasedOption("WithSpenderID", func(c *leaseConfig) { c.spenderID = id })
}

// WithEpoch sets the spender's incarnation number, which must grow across
// restarts of the same spender id. The default, 0, means the construction
// time in nanoseconds since the Unix epoch.
func WithEpoch(epoch uint64) Option {
	return leasedOption("WithEpoch", func(c *leaseConfig) { c.epoch = epoch })
}

// WithLeaseTuning sets a leased Limiter's timing knobs (see LeaseTuning).
// The default is DefaultLeaseTuning().
func WithLeaseTuning(t LeaseTuning) Option {
	return leasedOption("WithLeaseTuning", func(c *leaseConfig) { c.tuning = t })
}

// WithFallback sets the policy for keys without a valid lease while the
// allocator is unreachable. The default is FallbackShare.
func WithFallback(p FallbackPolicy) Option {
	return leasedOption("WithFallback", func(c *leaseConfig) { c.policy = p })
}

// WithLogger sets where a leased Limiter logs its transitions (into and out
// of fallback, a credential the allocator refuses, epoch changes, calls
// given up). The default is slog.Default(), read when the Limiter is made.
func WithLogger(l *slog.Logger) Option {
	return leasedOption("WithLogger", func(c *leaseConfig) { c.logger = l })
}

// WithMetrics makes the Limiter record into m (see NewMetrics). The
// default records nothing.
func WithMetrics(m *Metrics) Option {
	return leasedOption("WithMetrics", func(c *leaseConfig) { c.metrics = m })
}
