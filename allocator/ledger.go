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

// Ledger owns every key's global budget and hands it out in leases. It is
// the pure state machine of package ledger behind a mutex, with an
// optional durable store: a call takes the mutex, applies its command at
// the clock's now, hands the records it changed to the store's group
// commit, releases the mutex, and answers once those records are durable.
// A replicated Ledger (NewReplicated) instead applies each call through
// the raft log of a cluster, on the leader (see NewReplicated). The
// connect Service and in-process callers share it. A Ledger is safe for
// concurrent use.
type Ledger struct {
	cfg config

	mu     sync.Mutex // guards state and closed
	state  *ledger.State
	closed bool
	st     *store      // nil: memory only
	rep    *replicated // non-nil: a cluster member (NewReplicated); state and st are unused

	// atQuota holds the credentials whose last Acquire or ReserveAhead was
	// refused for their quota, until a sweep or a Release may have freed
	// some: the Service refuses their calls before reading them (a flood
	// past its quota then costs a header's check, not a 1,024-key decode).
	atQuota sync.Map // credential -> struct{}
}

// noteQuota records that err refused a call of credential cred for its
// quota (AtQuota reports it until a sweep or a Release).
func (l *Ledger) noteQuota(cred string, err error) {
	if errors.Is(err, ErrResourceExhausted) {
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
// for a durable one, NewReplicated for a cluster member.
func New(opts ...Option) (*Ledger, error) {
	l, err := configured(opts)
	if err != nil {
		return nil, err
	}
	if l.state, err = ledger.New(l.cfg.ledgerConfig()); err != nil {
		return nil, err
	}
	return l, nil
}

// configured returns a Ledger configured by opts, without its state.
func configured(opts []Option) (*Ledger, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o.apply(&cfg)
	}
	if cfg.policy == nil {
		return nil, fmt.Errorf("allocator: nil policy")
	}
	return &Ledger{cfg: cfg}, nil
}

// TTL returns the lease time to live.
func (l *Ledger) TTL() time.Duration { return l.cfg.ttl }

// Strict reports whether the ledger runs in strict mode.
func (l *Ledger) Strict() bool { return l.cfg.strict }

func (l *Ledger) now() bucket.Instant { return ledger.InstantOf(l.cfg.clock.Now()) }

// apply applies the command cmd builds for the clock's now and returns
// its reply once the records it changed (or, for a retry, every change
// applied before it) are durable.
func (l *Ledger) apply(cmd func(now bucket.Instant) ledger.Command) (any, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	if l.rep != nil {
		l.mu.Unlock()
		return l.rep.apply(cmd)
	}
	c := cmd(l.now())
	reply, changed, err := l.state.Apply(c)
	if l.cfg.applied != nil {
		var batch []byte
		if err == nil && !changed.Empty() {
			batch = l.state.AppendRecords(nil, changed)
		}
		l.cfg.applied(c, reply, batch, err)
	}
	if err != nil {
		l.mu.Unlock()
		return nil, err
	}
	var pos uint64
	if l.st != nil {
		// Encoded now, under l.mu: the next command changes the records, and
		// the journal must follow the order of application.
		pos = l.st.append(!changed.Empty(), func(b []byte) []byte { return l.state.AppendRecords(b, changed) })
	}
	l.mu.Unlock()
	if l.st != nil {
		if err := l.st.wait(pos); err != nil {
			return nil, err
		}
	}
	return reply, nil
}

// Acquire applies one Acquire call (see the proto LeaseService.Acquire):
// per key, it credits Returned up to the caller's holding, lowers the
// holding to Held, charges Debt, then grants what the policy allows if the
// buckets cover Need. A retry of the latest call returns the stored reply.
// The reply is the caller's own copy.
//
// It returns an error wrapping ErrInvalidArgument (nothing changed),
// ErrStaleEpoch, ErrStaleSequence, ErrSequenceReused, ErrEpochReleased,
// ErrClosed, or ErrNotDurable (applied in memory, not yet committed); a
// replicated Ledger also a *NotLeaderError, ErrOutcomeUnknown or
// ErrClockBehind.
func (l *Ledger) Acquire(ctx context.Context, c Caller, keys []AcquireKey) (*AcquireReply, error) {
	r, err := l.acquire(c, keys)
	if err != nil {
		return nil, err
	}
	out := *r
	out.Keys = slices.Clone(out.Keys)
	return &out, nil
}

// acquire is Acquire returning the reply the ledger stores, which the
// caller must not modify (the Service only reads it).
func (l *Ledger) acquire(c Caller, keys []AcquireKey) (*AcquireReply, error) {
	keys, err := heldLimits(l.cfg.keyLimits, keys, true, func(k *AcquireKey) (string, *ration.Limits) { return k.Key, &k.Limits })
	if err != nil {
		return nil, err
	}
	r, err := l.apply(func(now bucket.Instant) ledger.Command { return ledger.Acquire{Now: now, Caller: c, Keys: keys} })
	if err != nil {
		l.noteQuota(c.Credential, err)
		return nil, err
	}
	return r.(*AcquireReply), nil
}

// ReserveAhead applies one ReserveAhead call: per key, it reserves Cost for
// the earliest instant the buckets cover it, if that is within MaxWait,
// adding it to the caller's holding; otherwise it reserves nothing. Errors
// and retries as for Acquire.
func (l *Ledger) ReserveAhead(ctx context.Context, c Caller, keys []ReserveKey) (*ReserveReply, error) {
	keys, err := heldLimits(l.cfg.keyLimits, keys, true, func(k *ReserveKey) (string, *ration.Limits) { return k.Key, &k.Limits })
	if err != nil {
		return nil, err
	}
	r, err := l.apply(func(now bucket.Instant) ledger.Command { return ledger.ReserveAhead{Now: now, Caller: c, Keys: keys} })
	if err != nil {
		l.noteQuota(c.Credential, err)
		return nil, err
	}
	out := *r.(*ReserveReply)
	out.Keys = slices.Clone(out.Keys)
	return &out, nil
}

// Release applies one Release call: it credits each listed key's Returned
// up to the caller's holding and charges its Debt, then drops every
// holding of the caller's epoch and closes the epoch. Errors and retries as
// for Acquire.
func (l *Ledger) Release(ctx context.Context, c Caller, keys []ReleaseKey) (*ReleaseReply, error) {
	keys, err := heldLimits(l.cfg.keyLimits, keys, false, func(k *ReleaseKey) (string, *ration.Limits) { return k.Key, &k.Limits })
	if err != nil {
		return nil, err
	}
	r, err := l.apply(func(now bucket.Instant) ledger.Command { return ledger.Release{Now: now, Caller: c, Keys: keys} })
	if err != nil {
		return nil, err
	}
	l.atQuota.Clear() // leases it held are free
	return &ReleaseReply{Returned: slices.Clone(r.(*ReleaseReply).Returned)}, nil
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
// it periodically (cmd/allocator does, every TTL).
func (l *Ledger) Sweep(ctx context.Context) (keys, sessions int, err error) {
	for part := range uint32(sweepParts) {
		k, s, err := l.sweepPart(part)
		keys, sessions = keys+k, sessions+s
		if err != nil {
			return keys, sessions, err
		}
	}
	return keys, sessions, nil
}

// sweepPart sweeps part of sweepParts (see Sweep).
func (l *Ledger) sweepPart(part uint32) (keys, sessions int, err error) {
	r, err := l.apply(func(now bucket.Instant) ledger.Command {
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
func (l *Ledger) Stats() Stats {
	if l.rep != nil {
		return l.rep.node.FSM().Stats()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state.Stats()
}

// Close stops the ledger: later calls get ErrClosed. A durable ledger
// waits for commits in progress and closes its store; a replicated one
// shuts its node down (calls in flight get ErrOutcomeUnknown).
func (l *Ledger) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	if l.rep != nil {
		l.rep.close()
		return l.rep.node.Shutdown()
	}
	if l.st != nil {
		return l.st.close()
	}
	return nil
}

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
			return nil, &InputError{Field: fmt.Sprintf("keys[%d].key", i), Reason: "not a key of the allocator's limits (-limits-file)"}
		}
		*lim = held
	}
	return out, nil
}
