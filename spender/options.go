package spender

import "time"

// Option configures a Limiter. Options are applied in order by New.
type Option interface {
	apply(*config)
}

type config struct {
	shards int
	sweep  time.Duration
	lease  leaseConfig
}

func defaultConfig() config {
	return config{shards: 256, sweep: time.Minute, lease: defaultLeaseConfig()}
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithShards sets how many lock shards the Limiter spreads keys over,
// rounded up to a power of two. The default is 256; n <= 0 keeps it. More
// shards mean less contention between keys at a few hundred bytes each.
func WithShards(n int) Option {
	return optionFunc(func(c *config) {
		if n <= 0 {
			return
		}
		s := 1
		for s < n && s < 1<<16 {
			s <<= 1
		}
		c.shards = s
	})
}

// WithSweepInterval sets how often, in clock time, each shard drops the
// state of keys whose buckets are full again (a full bucket is the same as
// no state). The default is one minute; d <= 0 keeps it. A shard also
// sweeps whenever its key count has doubled since its last sweep, so memory
// stays proportional to the keys active within the last refill-to-full
// period plus this interval.
func WithSweepInterval(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d > 0 {
			c.sweep = d
		}
	})
}
