package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"connectrpc.com/connect/v2"
	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// Limiter is what the sidecar admits with: *spender.Limiter (standalone
// or leased) and *spender.Router provide it.
type Limiter interface {
	ReserveAll(ctx context.Context, charges []spender.Charge) (*spender.Reservations, error)
	ReserveAt(ctx context.Context, key string, lim ration.Limits, c ration.Amount, maxWait time.Duration) (spender.Reservation, time.Time, error)
}

// Defaults of the options.
const (
	DefaultHold    = 10 * time.Minute
	DefaultMaxOpen = 65536
)

// Service serves the reserve/settle API and Envoy's rate limit service on
// one Limiter. It is safe for concurrent use. Close it to settle what it
// still holds.
type Service struct {
	lim   Limiter
	clock ration.Clock
	holds *holds
	log   *slog.Logger
	m     *Metrics
	cfg   atomic.Pointer[Config] // the Envoy API's configuration; nil until SetConfig
}

// Option configures a Service.
type Option interface{ apply(*Service) }

type optionFunc func(*Service)

func (f optionFunc) apply(s *Service) { f(s) }

// WithClock sets the clock of the hold timers. The default is the system
// clock.
func WithClock(c ration.Clock) Option { return optionFunc(func(s *Service) { s.clock = c }) }

// WithHold sets how long a reservation is held, from its send time, before
// it is settled at its reserved cost: positive, at most a day. The default
// is DefaultHold, longer than a long streamed generation.
func WithHold(d time.Duration) Option {
	return optionFunc(func(s *Service) { s.holds.hold = d })
}

// WithMaxOpen bounds the reservations held at once (the reserve/settle
// API's and the Envoy pairs' together): a Reserve past it is UNAVAILABLE
// and reserves nothing. Positive; the default is DefaultMaxOpen.
func WithMaxOpen(n int) Option { return optionFunc(func(s *Service) { s.holds.max = n }) }

// WithLogger sets where the Service logs refusals it could not serve and
// configuration changes. The default discards.
func WithLogger(l *slog.Logger) Option { return optionFunc(func(s *Service) { s.log = l }) }

// WithMetrics records into m (see NewMetrics). The default records nothing.
func WithMetrics(m *Metrics) Option { return optionFunc(func(s *Service) { s.m = m }) }

// New returns a Service admitting with lim.
func New(lim Limiter, opts ...Option) (*Service, error) {
	s := &Service{lim: lim, clock: ration.SystemClock{}, log: slog.New(slog.DiscardHandler)}
	s.holds = newHolds(nil, DefaultHold, DefaultMaxOpen)
	for _, o := range opts {
		o.apply(s)
	}
	s.holds.clock = s.clock
	switch {
	case s.holds.hold <= 0 || s.holds.hold > 24*time.Hour:
		return nil, fmt.Errorf("sidecar: hold %v: want more than 0 and at most 24h", s.holds.hold)
	case s.holds.max < 1:
		return nil, fmt.Errorf("sidecar: max open reservations %d: want at least 1", s.holds.max)
	}
	s.holds.onExpire = s.m.expire
	if err := s.m.watchOpen(s.holds.open); err != nil {
		return nil, err
	}
	return s, nil
}

// SetConfig replaces the Envoy API's rate limit configuration; calls in
// flight finish with the one they started with.
func (s *Service) SetConfig(c *Config) { s.cfg.Store(c) }

// Config returns the Envoy API's rate limit configuration, nil before
// SetConfig.
func (s *Service) Config() *Config { return s.cfg.Load() }

// Open returns the number of reservations held.
func (s *Service) Open() int { return s.holds.open() }

// Close settles every held reservation at its reserved cost: their usage
// will not be known. Call it after the server stopped, before closing the
// Limiter (which then returns the unspent leases).
func (s *Service) Close() { s.holds.close() }

// statusCodeOf maps a Limiter error that is not a refusal to the code the
// caller sees, never INTERNAL (HTTP 500): bad input is INVALID_ARGUMENT
// with the Limiter's message, a key the allocator refused is
// FAILED_PRECONDITION, a caller that left is CANCELED, and anything else
// (a closed Limiter, an allocator that cannot be reached by a fail-closed
// policy) is UNAVAILABLE.
func statusCodeOf(err error) error {
	code := connect.CodeUnavailable
	switch {
	case errors.Is(err, spender.ErrInvalidKey), errors.Is(err, spender.ErrInvalidCost),
		errors.Is(err, spender.ErrInvalidCharges), errors.Is(err, ration.ErrInvalidLimits):
		code = connect.CodeInvalidArgument
	case errors.Is(err, spender.ErrKeyRejected):
		code = connect.CodeFailedPrecondition
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	}
	return connect.NewError(code, err.Error())
}

func invalid(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Sprintf("sidecar: "+format, args...))
}

// errFull is the answer at the bound of open reservations.
func errFull(max int) error {
	return connect.NewError(connect.CodeUnavailable,
		fmt.Sprintf("sidecar: %d reservations are open, the most it holds (-max-open-reservations): settle or cancel them", max))
}

// headersOf returns the HTTP stage's x-ratelimit-* headers for st, and
// for a refusal Retry-After (or x-should-retry: false when it can never
// fit), as a map of canonical names.
func headersOf(st spender.Status, rej *spender.RejectError) map[string]string {
	h := http.Header{}
	spenderhttp.SetHeaders(h, st)
	if rej != nil {
		if rej.Oversize {
			h.Set("X-Should-Retry", "false")
		} else {
			h.Set("Retry-After", fmt.Sprint(spender.RetryAfterSeconds(rej.RetryAfter)))
		}
	}
	out := make(map[string]string, len(h))
	for k, v := range h {
		out[k] = v[0]
	}
	return out
}
