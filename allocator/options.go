package allocator

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/bucket"
)

// Option configures a Ledger. An option that does not apply to the kind
// of Ledger being made (one only a durable or a replicated Ledger has a
// use for) makes its constructor fail, naming it.
type Option interface{ apply(*config) }

// kind is a set of kinds of Ledger: the one being made, or those an option
// applies to.
type kind uint8

const (
	inMemory         kind = 1 << iota // New
	journaled                         // Open
	replicatedLedger                  // NewReplicated

	anyLedger = inMemory | journaled | replicatedLedger
)

// String names the constructor of k, a single kind.
func (k kind) String() string {
	switch k {
	case inMemory:
		return "a memory-only Ledger (New)"
	case journaled:
		return "a durable Ledger (Open)"
	}
	return "a replicated Ledger (NewReplicated)"
}

// option is an Option named name that applies to the kinds of Ledger to.
type option struct {
	name string
	to   kind
	set  func(*config)
}

func (o option) apply(c *config) {
	if o.to&c.kind == 0 && c.misfit == "" {
		c.misfit = o.name
	}
	o.set(c)
}

type config struct {
	kind   kind   // the Ledger being made
	misfit string // the first option given that does not apply to it

	clock          ration.Clock
	ttl            time.Duration
	strict         bool
	policy         ledger.Policy
	sharePolicy    ledger.SharePolicy
	logger         *slog.Logger
	retention      time.Duration
	quota          ledger.Quota
	keyLimits      func(key string) (ration.Limits, bool)
	commitObserver func(time.Duration, error)
	linger         time.Duration
	hook           func(stage string) error                                       // tests: called inside every commit
	noSync         bool                                                           // tests: skip fsync
	clockWait      time.Duration                                                  // tests: a replicated leader's longest wait for its clock; 0: the election timeout
	applied        func(cmd ledger.Command, reply any, changed []byte, err error) // tests: every command, under the mutex
}

// configure returns the configuration opts give a Ledger of kind k, or
// an error naming the first option that does not apply to it.
func configure(opts []Option, k kind) (config, error) {
	cfg := defaultConfig()
	cfg.kind = k
	for _, o := range opts {
		o.apply(&cfg)
	}
	switch {
	case cfg.misfit != "":
		return config{}, fmt.Errorf("allocator: %s does not apply to %v", cfg.misfit, k)
	case cfg.policy == nil:
		return config{}, fmt.Errorf("allocator: WithPolicy: nil policy")
	}
	return cfg, nil
}

// now is the clock's now as a ledger instant.
func (c config) now() bucket.Instant { return ledger.InstantOf(c.clock.Now()) }

// ledgerConfig is the state machine's configuration: the same on every
// member of a cluster.
func (c config) ledgerConfig() ledger.Config {
	return ledger.Config{TTL: c.ttl, Strict: c.strict, Policy: c.policy, SharePolicy: c.sharePolicy, Retention: c.retention, Quota: c.quota}
}

func defaultConfig() config {
	return config{
		clock:     ration.SystemClock{},
		ttl:       10 * time.Second,
		policy:    ledger.ShareByRate{},
		logger:    slog.New(slog.DiscardHandler),
		retention: time.Hour,
		linger:    8 * time.Millisecond,
	}
}

// WithClock sets the clock; default SystemClock.
func WithClock(c ration.Clock) Option {
	return option{"WithClock", anyLedger, func(cfg *config) { cfg.clock = c }}
}

// WithTTL sets the lease time to live, 1 ms to 1 h; default 10 s. It enters
// the bound (C + rho*(t + TTL) in default mode).
func WithTTL(d time.Duration) Option {
	return option{"WithTTL", anyLedger, func(c *config) { c.ttl = d }}
}

// WithStrict selects strict mode (bound C + rho*t) when on; default off.
func WithStrict(on bool) Option {
	return option{"WithStrict", anyLedger, func(c *config) { c.strict = on }}
}

// WithPolicy sets the lease-sizing policy; default ShareByRate{}.
func WithPolicy(p ledger.Policy) Option {
	return option{"WithPolicy", anyLedger, func(c *config) { c.policy = p }}
}

// WithSharePolicy sets how a key's refill rate is split into refill shares
// among its spenders; default ProportionalShare with DefaultShareHeadroom
// (docs/allocator.md, "Refill shares").
func WithSharePolicy(p ledger.SharePolicy) Option {
	return option{"WithSharePolicy", anyLedger, func(c *config) { c.sharePolicy = p }}
}

// WithLogger sets the logger of a durable or replicated Ledger (its store
// and its raft node log); default discards. A memory-only Ledger logs
// nothing, so New refuses it.
func WithLogger(l *slog.Logger) Option {
	return option{"WithLogger", journaled | replicatedLedger, func(c *config) { c.logger = l }}
}

// WithSessionRetention sets how long a spender's exactly-once record is
// kept after its last call (and after its holdings expire); default 1 h.
// A retry older than this may be applied again (docs/allocator.md).
func WithSessionRetention(d time.Duration) Option {
	return option{"WithSessionRetention", anyLedger, func(c *config) { c.retention = d }}
}

// WithQuota bounds what the calls of each credential (the TokenID of the
// bearer token they came with, or "" without auth) may keep in the ledger:
// q.Sessions spender ids, and q.Keys each of keys created, leases held and
// key answers kept for retries. A call beyond it is refused with a
// *ledger.QuotaError (ResourceExhausted) and changes nothing. Default: no bound (0
// in a field: none). Every member of a cluster must use the same quota.
func WithQuota(q ledger.Quota) Option {
	return option{"WithQuota", anyLedger, func(c *config) { c.quota = q }}
}

// WithKeyLimits makes the allocator hold the fleet's limits: a lease call's
// limits for a key f knows are replaced by f's, so that no caller can set
// a key's limits (raise one to mint budget, or lower one to refuse the
// other gateways); an Acquire or ReserveAhead naming a key f does not know
// is refused (InvalidArgument naming keys[i].key, which the spender fails
// alone), and a Release's debt on such a key is not charged. f must be
// safe for concurrent use. Default: nil, each call's limits are followed
// (docs/bound.md, "Rules for callers").
func WithKeyLimits(f func(key string) (ration.Limits, bool)) Option {
	return option{"WithKeyLimits", anyLedger, func(c *config) { c.keyLimits = f }}
}

// WithCommitLinger sets the longest a group commit waits for more calls
// before it starts, when the previous commit was shared by several calls
// (a lone caller never waits); default 8 ms, 0 disables. It waits in steps
// of 1 ms (or d if shorter) while fewer than 64 calls wait. A step that
// brings no call also ends it after a light commit cycle (fewer than 16
// calls), and after a sustained one once as many calls wait as in the
// previous commit. So light load adds one step at most, and sustained load
// up to d, to a call's latency, in exchange for fewer fsyncs per call.
// For a durable or replicated Ledger (whose commit is a raft log entry);
// New refuses it.
func WithCommitLinger(d time.Duration) Option {
	return option{"WithCommitLinger", journaled | replicatedLedger, func(c *config) { c.linger = d }}
}

// WithCommitObserver calls f after every bbolt commit attempt with its
// latency and error (for metrics). Default none. For a durable Ledger
// (Open) only: New and NewReplicated refuse it.
func WithCommitObserver(f func(time.Duration, error)) Option {
	return option{"WithCommitObserver", journaled, func(c *config) { c.commitObserver = f }}
}

// withHook is for tests: f runs inside every commit, with stage "before"
// (before the commit takes the calls' journal bytes) and "after" (once
// they are put, before the transaction commits); a non-nil error aborts
// the commit, as a crash or an I/O error would.
func withHook(f func(stage string) error) Option {
	return option{"withHook", journaled, func(c *config) { c.hook = f }}
}

// withApplied is for tests: f sees every command the ledger applies, with
// its reply and the records it changed as a batch (a durable ledger's), or
// its error, in order of application (under the ledger's mutex).
func withApplied(f func(cmd ledger.Command, reply any, changed []byte, err error)) Option {
	return option{"withApplied", inMemory | journaled, func(c *config) { c.applied = f }}
}

// withClockWait is for tests: the longest a replicated Ledger's leader
// waits for its clock to reach the latest applied Now (stamp), instead of
// the raft election timeout.
func withClockWait(d time.Duration) Option {
	return option{"withClockWait", replicatedLedger, func(c *config) { c.clockWait = d }}
}

// withNoSync is for tests only: bbolt skips fsync. Never in production.
func withNoSync() Option { return option{"withNoSync", journaled, func(c *config) { c.noSync = true }} }
