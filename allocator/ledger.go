package allocator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/bucket"
)

// Ledger owns every key's global budget and hands it out in leases: the
// pure state machine of package ledger, applied through a store. Each
// kind of Ledger has its own store, its only variable part: memory (New:
// a ledger.State behind a mutex, each call applied at the clock's now),
// the bbolt journal (Open: the same, answering once the records the call
// changed are durable) or the raft log (NewReplicated: each call applied
// through the cluster's leader). The connect Service and in-process
// callers share it. A Ledger is safe for concurrent use.
//
// Every call takes a context. A call whose context has ended is refused
// before it is applied; one whose context ends while it waits for its
// commit returns at once an *AbandonedError stating what became of it
// (applied, not applied, or unknown).
type Ledger struct {
	cfg   config
	store store

	// atQuota holds the credentials whose last Acquire or ReserveAhead was
	// refused for their quota, until a sweep or a Release may have freed
	// some: the Service refuses their calls before reading them (a flood
	// past its quota then costs a header's check, not a 1,024-key decode).
	atQuota sync.Map // credential -> struct{}
}

// store is where a Ledger applies its commands and keeps what they
// change: memory (New), the bbolt journal (Open, store.go) or the raft log
// (NewReplicated, replicated.go).
type store interface {
	// apply applies the command build makes for the instant the store
	// applies it at, and returns its reply once what it changed is kept.
	// If ctx ends while the call waits for that, apply returns an
	// *AbandonedError at once.
	apply(ctx context.Context, build func(now bucket.Instant) ledger.Command) (any, error)
	// stats returns the current counts.
	stats() ledger.Stats
	// close stops the store; later calls get ErrClosed. A second close
	// does nothing.
	close() error
}

// noteQuota records that err refused a call of credential cred for its
// quota (AtQuota reports it until a sweep or a Release).
func (l *Ledger) noteQuota(cred string, err error) {
	if errors.Is(err, ledger.ErrResourceExhausted) {
		l.atQuota.Store(cred, struct{}{})
	}
}

// AtQuota reports whether credential cred's last Acquire or ReserveAhead
// was refused for its quota, with no sweep or Release since.
func (l *Ledger) AtQuota(cred string) bool {
	_, ok := l.atQuota.Load(cred)
	return ok
}

// New returns a memory-only Ledger: nothing survives the process. Use Open
// for a durable one, NewReplicated for a cluster member. An option that
// applies only to those (WithCommitLinger, WithCommitObserver) or that a
// memory-only Ledger has no use for (WithLogger: it logs nothing) is an
// error naming it.
func New(opts ...Option) (*Ledger, error) {
	cfg, err := configure(opts, inMemory)
	if err != nil {
		return nil, err
	}
	m, err := newMemory(cfg)
	if err != nil {
		return nil, err
	}
	return &Ledger{cfg: cfg, store: m}, nil
}

// TTL returns the lease time to live.
func (l *Ledger) TTL() time.Duration { return l.cfg.ttl }

// Strict reports whether the ledger runs in strict mode.
func (l *Ledger) Strict() bool { return l.cfg.strict }

// apply applies the command build makes through the store and returns
// its reply; a call whose ctx has ended is refused first, not applied.
func (l *Ledger) apply(ctx context.Context, build func(now bucket.Instant) ledger.Command) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, &AbandonedError{Err: err}
	}
	return l.store.apply(ctx, build)
}

// memory is a memory-only Ledger's store (New), and the journal's
// in-memory part (Open): a ledger.State behind a mutex, each command
// applied at the clock's now.
type memory struct {
	now     func() bucket.Instant
	applied func(cmd ledger.Command, reply any, changed []byte, err error) // withApplied (tests); nil: none

	mu     sync.Mutex // guards state and closed
	state  *ledger.State
	closed bool
}

func newMemory(cfg config) (*memory, error) {
	st, err := ledger.New(cfg.ledgerConfig())
	if err != nil {
		return nil, err
	}
	return &memory{now: cfg.now, applied: cfg.applied, state: st}, nil
}

func (m *memory) apply(_ context.Context, build func(now bucket.Instant) ledger.Command) (any, error) {
	reply, _, err := m.step(build, func(*ledger.State, ledger.Changes) uint64 { return 0 })
	return reply, err
}

// step applies the command build makes at the clock's now and hands the
// state and the records the command changed to keep, under the mutex (so
// that what keep sees follows the order of application); it returns the
// reply and keep's answer. A refused command changes nothing and is not
// handed to keep.
func (m *memory) step(build func(now bucket.Instant) ledger.Command, keep func(*ledger.State, ledger.Changes) uint64) (any, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, 0, ErrClosed
	}
	c := build(m.now())
	reply, changed, err := m.state.Apply(c)
	if m.applied != nil {
		var batch []byte
		if err == nil && !changed.Empty() {
			batch = m.state.AppendRecords(nil, changed)
		}
		m.applied(c, reply, batch, err)
	}
	if err != nil {
		return nil, 0, err
	}
	return reply, keep(m.state, changed), nil
}

func (m *memory) stats() ledger.Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state.Stats()
}

func (m *memory) close() error {
	m.shut()
	return nil
}

// shut marks the store closed and reports whether it was open.
func (m *memory) shut() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	was := !m.closed
	m.closed = true
	return was
}

// Acquire applies one Acquire call (see the proto LeaseService.Acquire):
// per key, it credits Returned up to the caller's holding, lowers the
// holding to Held, charges Debt, then grants what the policy allows if the
// buckets cover Need. A retry of the latest call returns the stored reply.
// The reply is the caller's own copy.
//
// It returns an error wrapping ledger.ErrInvalidArgument (nothing
// changed), ledger.ErrStaleEpoch, ErrStaleSequence, ErrSequenceReused,
// ErrEpochReleased, ErrForeignSpender or ErrResourceExhausted, ErrClosed,
// ErrNotDurable (applied in memory, not yet committed), or an
// *AbandonedError (ctx ended); a replicated Ledger also a
// *cluster.NotLeaderError, cluster.ErrOutcomeUnknown or ErrClockBehind.
func (l *Ledger) Acquire(ctx context.Context, c ledger.Caller, keys []ledger.AcquireKey) (*ledger.AcquireReply, error) {
	r, err := l.acquire(ctx, c, keys)
	if err != nil {
		return nil, err
	}
	out := *r
	out.Keys = slices.Clone(out.Keys)
	return &out, nil
}

// acquire is Acquire returning the reply the ledger stores, which the
// caller must not modify (the Service only reads it).
func (l *Ledger) acquire(ctx context.Context, c ledger.Caller, keys []ledger.AcquireKey) (*ledger.AcquireReply, error) {
	keys, err := heldLimits(l.cfg.keyLimits, keys, true, func(k *ledger.AcquireKey) (string, *ration.Limits) { return k.Key, &k.Limits })
	if err != nil {
		return nil, err
	}
	r, err := l.apply(ctx, func(now bucket.Instant) ledger.Command { return ledger.Acquire{Now: now, Caller: c, Keys: keys} })
	if err != nil {
		l.noteQuota(c.Credential, err)
		return nil, err
	}
	return r.(*ledger.AcquireReply), nil
}

// ReserveAhead applies one ReserveAhead call: per key, it reserves Cost for
// the earliest instant the buckets cover it, if that is within MaxWait,
// adding it to the caller's holding; otherwise it reserves nothing. Errors
// and retries as for Acquire.
func (l *Ledger) ReserveAhead(ctx context.Context, c ledger.Caller, keys []ledger.ReserveKey) (*ledger.ReserveReply, error) {
	keys, err := heldLimits(l.cfg.keyLimits, keys, true, func(k *ledger.ReserveKey) (string, *ration.Limits) { return k.Key, &k.Limits })
	if err != nil {
		return nil, err
	}
	r, err := l.apply(ctx, func(now bucket.Instant) ledger.Command { return ledger.ReserveAhead{Now: now, Caller: c, Keys: keys} })
	if err != nil {
		l.noteQuota(c.Credential, err)
		return nil, err
	}
	out := *r.(*ledger.ReserveReply)
	out.Keys = slices.Clone(out.Keys)
	return &out, nil
}

// Release applies one Release call: it credits each listed key's Returned
// up to the caller's holding and charges its Debt, then drops every
// holding of the caller's epoch and closes the epoch. Errors and retries as
// for Acquire.
func (l *Ledger) Release(ctx context.Context, c ledger.Caller, keys []ledger.ReleaseKey) (*ledger.ReleaseReply, error) {
	keys, err := heldLimits(l.cfg.keyLimits, keys, false, func(k *ledger.ReleaseKey) (string, *ration.Limits) { return k.Key, &k.Limits })
	if err != nil {
		return nil, err
	}
	r, err := l.apply(ctx, func(now bucket.Instant) ledger.Command { return ledger.Release{Now: now, Caller: c, Keys: keys} })
	if err != nil {
		return nil, err
	}
	l.atQuota.Clear() // leases it held are free
	return &ledger.ReleaseReply{Returned: slices.Clone(r.(*ledger.ReleaseReply).Returned)}, nil
}

// sweepParts is how many commands one Sweep takes: each sweeps the keys
// whose names hash to its part, so that a large state (a credential's
// quota of keys going idle at once) never holds the ledger for long: calls
// are applied between the parts.
const sweepParts = 16

// Sweep drops what holds no information at the clock's now: expired
// holdings, keys with no holdings whose buckets are full again (they are
// recreated full on their next call), and sessions idle for longer than
// the retention. It returns the number of keys and sessions dropped. Call
// it periodically (cmd/allocator does, every TTL). If ctx ends, it stops
// between parts (the parts already applied stay applied).
func (l *Ledger) Sweep(ctx context.Context) (keys, sessions int, err error) {
	for part := range uint32(sweepParts) {
		k, s, err := l.sweepPart(ctx, part)
		keys, sessions = keys+k, sessions+s
		if err != nil {
			return keys, sessions, err
		}
	}
	return keys, sessions, nil
}

// sweepPart sweeps part of sweepParts (see Sweep).
func (l *Ledger) sweepPart(ctx context.Context, part uint32) (keys, sessions int, err error) {
	r, err := l.apply(ctx, func(now bucket.Instant) ledger.Command {
		return ledger.Sweep{Now: now, Part: part, Parts: sweepParts}
	})
	if err != nil {
		return 0, 0, err
	}
	l.atQuota.Clear() // what it dropped may have freed some
	sr := r.(*ledger.SweepReply)
	return sr.Keys, sr.Sessions, nil
}

// Stats returns current counts. It walks every key: call it at scrape
// rate, not per request.
func (l *Ledger) Stats() ledger.Stats { return l.store.stats() }

// Close stops the ledger: later calls get ErrClosed. A durable ledger
// waits for commits in progress and closes its store; a replicated one
// shuts its node down (calls in flight get cluster.ErrOutcomeUnknown).
func (l *Ledger) Close() error { return l.store.close() }

// heldLimits returns keys with each key's limits replaced by f's (nil f:
// keys as they are; the caller's slice is not modified). A key f does not
// know is an *InputError naming it if refuse is set, and otherwise gets no
// limits (nothing is charged on it).
func heldLimits[K any](f func(string) (ration.Limits, bool), keys []K, refuse bool, at func(*K) (string, *ration.Limits)) ([]K, error) {
	if f == nil {
		return keys, nil
	}
	out := slices.Clone(keys)
	for i := range out {
		name, lim := at(&out[i])
		held, ok := f(name)
		if !ok && refuse {
			return nil, &ledger.InputError{Field: fmt.Sprintf("keys[%d].key", i), Reason: "not a key of the allocator's limits (-limits-file)"}
		}
		*lim = held
	}
	return out, nil
}
