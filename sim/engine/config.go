package engine

import (
	"fmt"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/spender"
)

// Strategy names one way of enforcing a key's budget across the fleet.
type Strategy string

// The strategies compared on identical traffic.
const (
	// Static gives every live instance a standalone Limiter with limit/N
	// (the same bucket code); N follows the live count.
	Static Strategy = "static"
	// Central asks the allocator for every request (one Acquire with
	// need = cost through the simulated network) and returns the unused
	// part at settlement (a second call). The allocator runs strict, so
	// this is the exact global bucket with a round trip per request.
	Central Strategy = "central"
	// Leased is ration: every instance embeds a leased spender.Limiter
	// whose lease state machine the simulator moves; the allocator runs in
	// default mode
	// (bound C + rho*(t + TTL)).
	Leased Strategy = "leased"
	// LeasedStrict is Leased against a strict allocator (bound C + rho*t).
	LeasedStrict Strategy = "leased-strict"
	// Sticky routes every request of the key to one owner instance (a
	// rendezvous hash over the live instances) whose standalone Limiter
	// holds the whole budget; a new owner starts with its own bucket.
	Sticky Strategy = "sticky"
)

// Strategies returns every strategy in report order.
func Strategies() []Strategy { return []Strategy{Static, Central, Leased, LeasedStrict, Sticky} }

// ParseStrategy returns the strategy named s.
func ParseStrategy(s string) (Strategy, error) {
	for _, st := range Strategies() {
		if string(st) == s {
			return st, nil
		}
	}
	return "", fmt.Errorf("engine: unknown strategy %q (want one of %v)", s, Strategies())
}

// Net describes the simulated network between spenders and the allocator.
// Every message travels Latency plus a uniform jitter in [0, Jitter); each
// is lost independently with probability Loss. A lost request or reply is
// noticed by a central slot after CallTimeout (a leased spender uses its
// own attempt timeout, as in a gateway); a partitioned or down allocator
// refuses at once (noticed after one round trip).
type Net struct {
	Latency     time.Duration // one-way base latency; default 1ms
	Jitter      time.Duration // added uniform jitter, [0, Jitter); default 500µs
	Loss        float64       // probability a message is lost, each way; default 0
	CallTimeout time.Duration // how long a central slot waits for a lost reply; default ten round trips, at least 25ms
}

// Config is one simulation run: one scenario, one strategy.
type Config struct {
	Scenario  Scenario
	Strategy  Strategy
	Instances int           // fleet size N (the maximum, for autoscaling); default 8
	Duration  time.Duration // virtual time traffic is offered; default the scenario's, or 5m
	Seed      uint64        // seeds the traffic, the schedule and the network; same seed, same result

	// Limits of the one simulated key. Zero: the scenario's
	// (Scenario.DefaultLimits).
	Limits ration.Limits
	// Overload is offered load over the binding limit's rate; default 2.
	Overload float64

	Net          Net
	TTL          time.Duration          // allocator lease TTL; default 10s (the allocator's)
	Policy       ledger.Policy          // lease sizing; nil = ledger.ShareByRate{}
	Fallback     spender.FallbackPolicy // leased spenders' policy while the allocator is unreachable
	SlowDeadline time.Duration          // spender slow-path deadline; default 50ms (the spender's)
	Horizon      time.Duration          // spender lease horizon; default 2s (the spender's)
	Tick         time.Duration          // spender maintenance interval; default 250ms (the spender's)
	SeriesStep   time.Duration          // time-series bucket width; default 1s, or Duration/300 when longer (about 300 points a run)

	// Refresh is the refresh interval active (key, gateway) pairs are
	// counted over (Result.ActivePairs): a pair is active in an interval
	// when the gateway was offered a request charged to the key in it.
	// Default: the lease horizon, how much spend one refresh covers.
	Refresh time.Duration

	// Progress, if not nil, is called now and then with the virtual time
	// reached and the total (traffic plus drain). It must not block.
	Progress func(done, total time.Duration)

	// wrapSource, if not nil, wraps the allocator's service as every
	// allocator call of the run reaches it (tests count through it).
	wrapSource func(spender.LeaseSource) spender.LeaseSource
	// retryAfter, if not nil, replaces the Retry-After each refusal tells
	// its client (tests: a gateway that names the wrong wait).
	retryAfter func(time.Duration) time.Duration
	// leak, if set, has the gateways never settle a request, as a gateway
	// that forgets its reservations (tests: a holding kept on purpose).
	leak bool
}

// withDefaults fills zero fields.
func (c Config) withDefaults() Config {
	if c.Instances <= 0 {
		c.Instances = 8
	}
	if c.Duration <= 0 {
		c.Duration = c.Scenario.Duration
	}
	if c.Duration <= 0 {
		c.Duration = 5 * time.Minute
	}
	if c.Limits == (ration.Limits{}) {
		c.Limits = c.Scenario.DefaultLimits()
	}
	if c.Overload <= 0 {
		c.Overload = 2
	}
	if c.Net.Latency <= 0 {
		c.Net.Latency = time.Millisecond
	}
	if c.Net.Jitter <= 0 {
		c.Net.Jitter = 500 * time.Microsecond
	}
	if c.Scenario.Loss > c.Net.Loss {
		c.Net.Loss = c.Scenario.Loss
	}
	if c.Scenario.Jitter > c.Net.Jitter {
		c.Net.Jitter = c.Scenario.Jitter
	}
	if c.Net.CallTimeout <= 0 {
		c.Net.CallTimeout = max(25*time.Millisecond, 10*2*(c.Net.Latency+c.Net.Jitter/2))
	}
	if c.TTL <= 0 {
		c.TTL = 10 * time.Second
	}
	lt := spender.DefaultLeaseTuning()
	if c.SlowDeadline <= 0 {
		c.SlowDeadline = lt.SlowPathDeadline
	}
	if c.Horizon <= 0 {
		c.Horizon = lt.Horizon
	}
	if c.Tick <= 0 {
		c.Tick = lt.MaintenanceInterval
	}
	if c.SeriesStep <= 0 {
		c.SeriesStep = max(time.Second, c.Duration/300)
	}
	if c.Refresh <= 0 {
		c.Refresh = c.Horizon
	}
	return c
}
