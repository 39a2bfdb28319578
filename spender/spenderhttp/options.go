package spenderhttp

import (
	"context"
	"log/slog"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender"
)

// DefaultMaxBodyBytes is the largest request body, in bytes, that
// Middleware reads by default: 16 MiB.
const DefaultMaxBodyBytes = 16 << 20

// DefaultMaxBodyBytesInFlight is how many body bytes, by default, the
// handlers of one Middleware hold at once: 256 MiB.
const DefaultMaxBodyBytesInFlight = 256 << 20

// Option configures Middleware and SetHeaders. Options apply in order; a
// later one overrides an earlier one. SetHeaders reads only the header
// options (WithAnthropicHeaders, WithIETFHeaders, WithClock).
type Option interface {
	apply(*config)
}

type config struct {
	maxBody     int64
	maxInFlight int64
	anthropic   bool
	ietf        bool
	clock       ration.Clock
	logger      *slog.Logger
	overrun     bool  // inject a max when the request has none
	overrunMax  int64 // the max to inject; 0 = what the key's token budget covers
	decided     func(context.Context, Decision)
}

func newConfig(opts []Option) config {
	c := config{
		maxBody:     DefaultMaxBodyBytes,
		maxInFlight: DefaultMaxBodyBytesInFlight,
		clock:       ration.SystemClock{},
		logger:      slog.New(slog.DiscardHandler),
		decided:     func(context.Context, Decision) {},
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithMaxBodyBytes sets the largest request body Middleware reads, in
// bytes. A larger body is answered 413 in the OpenAI error shape and
// reserves nothing. The default is DefaultMaxBodyBytes (16 MiB); n <= 0
// keeps it.
func WithMaxBodyBytes(n int64) Option {
	return optionFunc(func(c *config) {
		if n > 0 {
			c.maxBody = n
		}
	})
}

// WithMaxBodyBytesInFlight caps the request body bytes that all handlers
// of one Middleware hold at once, counted as every buffer allocated while
// the body is read (a growing buffer leaves its smaller copies to the
// collector: about twice the bytes received, at most four times plus
// 4 KiB), from the first byte read until the handler returns. A request whose body would pass the cap is
// answered 503 server_overloaded with Retry-After: 1 and reserves nothing:
// the gateway is short of memory, not the key of budget, so it is not a
// 429. The default is DefaultMaxBodyBytesInFlight (256 MiB); n <= 0 keeps
// it. A cap below WithMaxBodyBytes refuses the largest bodies even
// on an idle gateway.
func WithMaxBodyBytesInFlight(n int64) Option {
	return optionFunc(func(c *config) {
		if n > 0 {
			c.maxInFlight = n
		}
	})
}

// WithAnthropicHeaders adds Anthropic's rate-limit headers next to the
// x-ratelimit-* ones: anthropic-ratelimit-{requests,tokens}-{limit,
// remaining,reset}, the resets as RFC 3339 instants (UTC, second
// precision, rounded up) when the bucket is full again. Off by default.
func WithAnthropicHeaders() Option {
	return optionFunc(func(c *config) { c.anthropic = true })
}

// WithIETFHeaders adds the RateLimit-Policy and RateLimit fields of the
// IETF httpapi rate-limit headers draft (-11), one item per limited
// dimension, named "requests" and "tokens". Off by default.
//
// The draft registers no unit for tokens; the token policy carries
// qu="tokens" anyway. Its quota q is the bucket capacity and its window w
// is 60 seconds, which is exact for the default burst (capacity = the
// per-minute rate). RateLimit's t is the seconds until the bucket is full,
// rounded up.
func WithIETFHeaders() Option {
	return optionFunc(func(c *config) { c.ietf = true })
}

// WithClock sets the clock that turns reset durations into the instants
// of the Anthropic headers. The default is spender.SystemClock; nil keeps
// it. It has no effect on budgets: those follow the Reserver's clock.
func WithClock(clk ration.Clock) Option {
	return optionFunc(func(c *config) {
		if clk != nil {
			c.clock = clk
		}
	})
}

// WithLogger sets where Middleware logs rejections it maps to errors,
// settlement fallbacks and bad input. The default discards; nil keeps it.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}

// WithBoundedOverrun makes Middleware cap the output of requests that set
// none of max_completion_tokens, max_tokens and max_output_tokens, so one
// response cannot overrun its reservation without bound. Off by default:
// such requests reserve DefaultCompletionTokens and are charged any overrun
// at settlement, which can drive the key's token bucket negative.
//
// With maxTokens > 0, Middleware reserves the prompt plus maxTokens per
// choice and injects "max_tokens": maxTokens into the forwarded body. With
// maxTokens == 0 (or negative), it reserves the prompt plus
// DefaultCompletionTokens per choice and then injects what the key's token
// budget can still cover: the reserved completion plus the tokens left
// after the reservation, divided by n. The response can then use at most
// the key's remaining budget, so the bucket does not go below zero on its
// account (up to the error in the prompt estimate).
//
// Only requests that generate (prompt or messages) on a key with a token
// limit are changed; the body is re-encoded with its keys in sorted order.
func WithBoundedOverrun(maxTokens int64) Option {
	return optionFunc(func(c *config) {
		c.overrun = true
		c.overrunMax = max(maxTokens, 0)
	})
}

// Decision is what Middleware decided for a request it reserved for: see
// WithDecisions.
type Decision struct {
	// Admitted reports whether the request was reserved for and passed to
	// the handler; false: it was refused 429.
	Admitted bool
	// Budget is the id of the budget that refused the request: its key's
	// KeyID, or the Key of one of its Budgets. Empty when admitted.
	Budget string
	// Dimension is what the refusing budget lacked.
	Dimension spender.Dimension
}

// WithDecisions makes Middleware call f once for each request it tries
// to reserve for, with the request's context and the decision: admitted
// (before the handler runs), or refused 429 by a budget (before the
// refusal is written). f runs on the request's goroutine: it must not
// block. Requests answered before the reservation (a body too large or
// unreadable, a negative max_tokens) and reservations that fail otherwise
// (an invalid key or limits, an unusable limiter) are not reported: their
// status says what happened. The default reports nothing; nil keeps it.
func WithDecisions(f func(context.Context, Decision)) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.decided = f
		}
	})
}
