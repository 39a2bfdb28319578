package allocator

import (
	"log/slog"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
)

// Option configures a Ledger.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	clock          ration.Clock
	ttl            time.Duration
	strict         bool
	policy         Policy
	sharePolicy    SharePolicy
	logger         *slog.Logger
	retention      time.Duration
	quota          Quota
	keyLimits      func(key string) (ration.Limits, bool)
	commitObserver func(time.Duration, error)
	linger         time.Duration
	hook           func(stage string) error                                       // tests: called inside every commit
	noSync         bool                                                           // tests: skip fsync
	clockWait      time.Duration                                                  // tests: a replicated leader's longest wait for its clock; 0: the election timeout
	applied        func(cmd ledger.Command, reply any, changed []byte, err error) // tests: every command, under the mutex
}

// ledgerConfig is the state machine's configuration: the same on every
// member of a cluster.
func (c config) ledgerConfig() ledger.Config {
	return ledger.Config{TTL: c.ttl, Strict: c.strict, Policy: c.policy, SharePolicy: c.sharePolicy, Retention: c.retention, Quota: c.quota}
}

func defaultConfig() config {
	return config{
		clock:     ration.SystemClock{},
		ttl:       10 * time.Second,
		policy:    ShareByRate{},
		logger:    slog.New(slog.DiscardHandler),
		retention: time.Hour,
		linger:    8 * time.Millisecond,
	}
}

// WithClock sets the clock; default SystemClock.
func WithClock(c ration.Clock) Option { return optionFunc(func(cfg *config) { cfg.clock = c }) }

// WithTTL sets the lease time to live, 1 ms to 1 h; default 10 s. It enters
// the bound (C + rho*(t + TTL) in default mode).
func WithTTL(d time.Duration) Option { return optionFunc(func(c *config) { c.ttl = d }) }

// WithStrict selects strict mode (bound C + rho*t) when on; default off.
func WithStrict(on bool) Option { return optionFunc(func(c *config) { c.strict = on }) }

// WithPolicy sets the lease-sizing policy; default ShareByRate{}.
func WithPolicy(p Policy) Option { return optionFunc(func(c *config) { c.policy = p }) }

// WithSharePolicy sets how a key's refill rate is split into refill shares
// among its spenders; default ProportionalShare with DefaultShareHeadroom
// (docs/allocator.md, "Refill shares").
func WithSharePolicy(p SharePolicy) Option { return optionFunc(func(c *config) { c.sharePolicy = p }) }

// WithLogger sets the logger; default discards.
func WithLogger(l *slog.Logger) Option { return optionFunc(func(c *config) { c.logger = l }) }

// WithSessionRetention sets how long a spender's exactly-once record is
// kept after its last call (and after its holdings expire); default 1 h.
// A retry older than this may be applied again (docs/allocator.md).
func WithSessionRetention(d time.Duration) Option {
	return optionFunc(func(c *config) { c.retention = d })
}

// WithQuota bounds what the calls of each credential (the TokenID of the
// bearer token they came with, or "" without auth) may keep in the ledger:
// q.Sessions spender ids, and q.Keys each of keys created, leases held and
// key answers kept for retries. A call beyond it is refused with a
// *QuotaError (ResourceExhausted) and changes nothing. Default: no bound (0
// in a field: none). Every member of a cluster must use the same quota.
func WithQuota(q Quota) Option { return optionFunc(func(c *config) { c.quota = q }) }

// WithKeyLimits makes the allocator hold the fleet's limits: a lease call's
// limits for a key f knows are replaced by f's, so that no caller can set
// a key's limits (raise one to mint budget, or lower one to refuse the
// other gateways); an Acquire or ReserveAhead naming a key f does not know
// is refused (InvalidArgument naming keys[i].key, which the spender fails
// alone), and a Release's debt on such a key is not charged. f must be
// safe for concurrent use. Default: nil, each call's limits are followed
// (docs/bound.md, "Rules for callers").
func WithKeyLimits(f func(key string) (ration.Limits, bool)) Option {
	return optionFunc(func(c *config) { c.keyLimits = f })
}

// WithCommitLinger sets the longest a group commit waits for more calls
// before it starts, when the previous commit was shared by several calls
// (a lone caller never waits); default 8 ms, 0 disables. It waits in steps
// of 1 ms (or d if shorter) while fewer than 64 calls wait. A step that
// brings no call also ends it after a light commit cycle (fewer than 16
// calls), and after a sustained one once as many calls wait as in the
// previous commit. So light load adds one step at most, and sustained load
// up to d, to a call's latency, in exchange for fewer fsyncs per call.
func WithCommitLinger(d time.Duration) Option {
	return optionFunc(func(c *config) { c.linger = d })
}

// WithCommitObserver calls f after every bbolt commit attempt with its
// latency and error (for metrics). Default none.
func WithCommitObserver(f func(time.Duration, error)) Option {
	return optionFunc(func(c *config) { c.commitObserver = f })
}

// withHook is for tests: f runs inside every commit, with stage "before"
// (before the commit takes the calls' journal bytes) and "after" (once
// they are put, before the transaction commits); a non-nil error aborts
// the commit, as a crash or an I/O error would.
func withHook(f func(stage string) error) Option {
	return optionFunc(func(c *config) { c.hook = f })
}

// withApplied is for tests: f sees every command the ledger applies, with
// its reply and the records it changed as a batch (a durable ledger's), or
// its error, in order of application (under the ledger's mutex).
func withApplied(f func(cmd ledger.Command, reply any, changed []byte, err error)) Option {
	return optionFunc(func(c *config) { c.applied = f })
}

// withClockWait is for tests: the longest a replicated Ledger's leader
// waits for its clock to reach the latest applied Now (stamp), instead of
// the raft election timeout.
func withClockWait(d time.Duration) Option { return optionFunc(func(c *config) { c.clockWait = d }) }

// withNoSync is for tests only: bbolt skips fsync. Never in production.
func withNoSync() Option { return optionFunc(func(c *config) { c.noSync = true }) }
