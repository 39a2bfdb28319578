package echo

import (
	"log/slog"
	"time"
)

// DefaultMaxBodyBytes is the largest request body, in bytes, the engine
// reads by default: 16 MiB.
const DefaultMaxBodyBytes = 16 << 20

// DefaultDimensions is the length of an embedding vector when the request
// sets no "dimensions".
const DefaultDimensions = 16

// MaxDimensions is the largest "dimensions" an embeddings request may ask
// for.
const MaxDimensions = 4096

// DefaultModel is the one model the engine lists when WithModels is not
// given.
const DefaultModel = "echo"

// Clock tells the time the engine writes into "created" fields.
// spender.Clock and *fakeclock.Clock satisfy it.
type Clock interface {
	Now() time.Time
}

// Option configures an Engine. Options apply in order; a later one
// overrides an earlier one.
type Option interface {
	apply(*config)
}

type config struct {
	clock   Clock
	delay   time.Duration
	models  []string
	maxBody int64
	logger  *slog.Logger
}

func newConfig(opts []Option) config {
	c := config{
		clock:   systemClock{},
		models:  []string{DefaultModel},
		maxBody: DefaultMaxBodyBytes,
		logger:  slog.New(slog.DiscardHandler),
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

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// WithClock sets the clock whose Unix seconds go into every "created"
// field. The default is the system clock; nil keeps it.
func WithClock(c Clock) Option {
	return optionFunc(func(cfg *config) {
		if c != nil {
			cfg.clock = c
		}
	})
}

// WithTokenDelay makes a streamed response wait d (real time) before each
// generated token, so streaming can be watched. The default is 0, no
// wait; d < 0 keeps it. Non-streamed responses never wait.
func WithTokenDelay(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d >= 0 {
			c.delay = d
		}
	})
}

// WithModels sets the model IDs GET /v1/models lists. The default is
// just DefaultModel ("echo"); an empty list keeps it. Completion requests
// accept any non-empty model name either way and echo it back.
func WithModels(ids ...string) Option {
	return optionFunc(func(c *config) {
		if len(ids) > 0 {
			c.models = append([]string(nil), ids...)
		}
	})
}

// WithMaxBodyBytes sets the largest request body the engine reads, in
// bytes; a larger one is answered 413. The default is
// DefaultMaxBodyBytes; n <= 0 keeps it.
func WithMaxBodyBytes(n int64) Option {
	return optionFunc(func(c *config) {
		if n > 0 {
			c.maxBody = n
		}
	})
}

// WithLogger sets where the engine logs requests it refuses. The default
// discards; nil keeps it.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}
