package spender

import (
	"errors"
	"fmt"
	"time"

	"github.com/rationhq/ration"
)

// Option configures a Limiter. Options are applied in order by New, which
// then checks the result: an invalid option, or one that applies only to
// a leased Limiter given without WithLeases, makes New return an error
// wrapping ErrInvalidOption that names it.
type Option interface {
	apply(*config)
}

// ErrInvalidOption is matched (errors.Is) by New's error for an invalid
// option.
var ErrInvalidOption = errors.New("spender: invalid option")

type config struct {
	shards int
	sweep  time.Duration
	lease  leaseConfig
	// leasedOnly is the first option given that applies to a leased
	// Limiter only (leasedOption), "" if none.
	leasedOnly string
}

func defaultConfig() config {
	return config{shards: 256, sweep: time.Minute, lease: defaultLeaseConfig()}
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// leasedOption is the option named name that sets part of a leased
// Limiter's configuration: New refuses it without WithLeases.
func leasedOption(name string, set func(*leaseConfig)) Option {
	return optionFunc(func(c *config) {
		if c.leasedOnly == "" {
			c.leasedOnly = name
		}
		set(&c.lease)
	})
}

// WithShards sets how many lock shards the Limiter spreads keys over: 1 to
// 65536, rounded up to a power of two. The default is 256. More shards
// mean less contention between keys.
func WithShards(n int) Option {
	return optionFunc(func(c *config) { c.shards = n })
}

// WithSweepInterval sets how often, in clock time, each shard drops the
// state of keys whose buckets are full again (a full bucket is the same as
// no state). It must be positive; the default is one minute. A shard also
// sweeps whenever its key count has doubled since its last sweep, so memory
// stays proportional to the keys active within the last refill-to-full
// period plus this interval.
func WithSweepInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.sweep = d })
}

// validate checks c as New is about to use it.
func (c *config) validate() error {
	bad := func(option, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidOption, option, fmt.Sprintf(format, args...))
	}
	switch {
	case c.shards < 1 || c.shards > 1<<16:
		return bad("WithShards", "%d shards, want 1 to 65536", c.shards)
	case c.sweep <= 0:
		return bad("WithSweepInterval", "%v, want a positive duration", c.sweep)
	}
	l := &c.lease
	if !l.leased {
		if c.leasedOnly != "" {
			return bad(c.leasedOnly, "applies to a leased Limiter only (WithLeases)")
		}
		return nil
	}
	if l.src == nil {
		return bad("WithLeases", "nil LeaseSource")
	}
	if l.spenderID != "" {
		if err := ration.ValidSpenderID(l.spenderID); err != nil {
			return bad("WithSpenderID", "%v", err)
		}
	}
	if l.policy > FailOpen {
		return bad("WithFallback", "unknown policy %d", l.policy)
	}
	return l.tuning.Validate()
}

// roundShards rounds n up to a power of two.
func roundShards(n int) int {
	s := 1
	for s < n {
		s <<= 1
	}
	return s
}
