package allocator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// unixEpoch is the allocator's Instant epoch: durable state survives restarts.
var unixEpoch = time.Unix(0, 0)

// Ledger owns every key's global budget and hands it out in leases. It is
// transport-neutral: the connect Service and in-process callers share it.
// A Ledger is safe for concurrent use; calls are serialised by one mutex
// (the work per key is a few hundred nanoseconds) and, when durable, wait
// for their group commit after releasing it.
type Ledger struct {
	cfg config

	mu       sync.Mutex           // guards everything below
	keys     map[string]*keyState // by API key
	sessions map[string]*session  // by spender id
	closed   bool
	st       *store // nil: memory only
}

// New returns a memory-only Ledger: nothing survives the process. Use Open
// for a durable one.
func New(opts ...Option) (*Ledger, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o.apply(&cfg)
	}
	if cfg.ttl < time.Millisecond || cfg.ttl > time.Hour {
		return nil, fmt.Errorf("allocator: lease TTL %v outside [1ms, 1h]", cfg.ttl)
	}
	if cfg.policy == nil {
		return nil, fmt.Errorf("allocator: nil policy")
	}
	cfg.retention = max(cfg.retention, 2*cfg.ttl)
	return &Ledger{cfg: cfg, keys: make(map[string]*keyState), sessions: make(map[string]*session)}, nil
}

// TTL returns the lease time to live.
func (l *Ledger) TTL() time.Duration { return l.cfg.ttl }

// Strict reports whether the ledger runs in strict mode.
func (l *Ledger) Strict() bool { return l.cfg.strict }

func (l *Ledger) now() bucket.Instant { return bucket.InstantOf(unixEpoch, l.cfg.clock.Now()) }

// Acquire applies one Acquire call (see the proto LeaseService.Acquire):
// per key, it credits Returned up to the caller's holding, lowers the
// holding to Held, charges Debt, then grants what the policy allows if the
// buckets cover Need. A retry of the latest call returns the stored reply.
// The reply is the caller's own copy.
//
// It returns an error wrapping ErrInvalidArgument (nothing changed),
// ErrStaleEpoch, ErrStaleSequence, ErrSequenceReused, ErrEpochReleased,
// ErrClosed, or ErrNotDurable (applied in memory, not yet committed).
func (l *Ledger) Acquire(ctx context.Context, c Caller, keys []AcquireKey) (*AcquireReply, error) {
	r := new(AcquireReply)
	if err := l.acquire(ctx, c, keys, r); err != nil {
		return nil, err
	}
	return r, nil
}

// acquire is Acquire writing the reply into out, reusing out.Keys (the
// Service passes pooled replies).
func (l *Ledger) acquire(ctx context.Context, c Caller, keys []AcquireKey, out *AcquireReply) error {
	if err := validateAcquire(c, keys); err != nil {
		return err
	}
	d := digestAcquire(keys)
	// Allocated before the mutex: an allocation may assist the GC, which
	// must not stall every other call.
	out.Keys = slices.Grow(out.Keys[:0], len(keys))[:len(keys)]
	l.mu.Lock()
	stored, s, now, err := l.begin(&c, kindAcquire, d)
	if err != nil || stored != nil {
		if stored != nil {
			r := stored.(*AcquireReply)
			if s.noSnapshots {
				for i := range r.Keys {
					r.Keys[i].Snapshot = l.snapshotNow(keys[i].Key, keys[i].Limits)
				}
				s.noSnapshots = false
			}
			copy(out.Keys, r.Keys)
			out.LeaseTTL = r.LeaseTTL
		}
		end := l.logEnd()
		l.mu.Unlock()
		if err != nil {
			return err
		}
		return l.syncTo(end)
	}
	// The session's stored reply is rewritten in place: once this call is
	// applied, a retry of the previous one is stale, and callers get copies.
	reply := s.acquireReply
	if reply == nil {
		reply = new(AcquireReply)
		s.acquireReply = reply
	}
	if cap(reply.Keys) < len(keys) {
		reply.Keys = make([]AcquireResult, len(keys))
	}
	reply.Keys, reply.LeaseTTL = reply.Keys[:len(keys)], l.cfg.ttl
	if cap(s.keys) < len(keys) {
		s.keys = append(s.keys[:cap(s.keys)], make([]*keyState, len(keys)-cap(s.keys))...)
	}
	hints := s.keys[:len(keys)]
	for i := range keys {
		reply.Keys[i] = AcquireResult{}
		if ks := l.acquireKey(&keys[i], c, now, &reply.Keys[i], hints[i]); ks != hints[i] {
			hints[i] = ks // stored only when it changes: a pointer store passes the GC's write barrier
		}
	}
	s.keys = hints
	l.finish(s, c, kindAcquire, d, reply, now)
	copy(out.Keys, reply.Keys)
	out.LeaseTTL = reply.LeaseTTL
	end := l.logEnd()
	l.mu.Unlock()
	return l.syncTo(end)
}

// ReserveAhead applies one ReserveAhead call: per key, it reserves Cost for
// the earliest instant the buckets cover it, if that is within MaxWait,
// adding it to the caller's holding; otherwise it reserves nothing. Errors
// and retries as for Acquire.
func (l *Ledger) ReserveAhead(ctx context.Context, c Caller, keys []ReserveKey) (*ReserveReply, error) {
	if err := validateReserve(c, keys); err != nil {
		return nil, err
	}
	d := digestReserve(keys)
	reply := &ReserveReply{Keys: make([]ReserveResult, len(keys)), LeaseTTL: l.cfg.ttl} // before the mutex, as in Acquire
	l.mu.Lock()
	stored, s, now, err := l.begin(&c, kindReserve, d)
	if err != nil || stored != nil {
		if stored != nil && s.noSnapshots {
			r := stored.(*ReserveReply)
			for i := range r.Keys {
				r.Keys[i].Snapshot = l.snapshotNow(keys[i].Key, keys[i].Limits)
			}
			s.noSnapshots = false
		}
		end := l.logEnd()
		l.mu.Unlock()
		if err != nil {
			return nil, err
		}
		return stored.(*ReserveReply), l.syncTo(end)
	}
	for i := range keys {
		l.reserveKey(&keys[i], c, now, &reply.Keys[i])
	}
	l.finish(s, c, kindReserve, d, reply, now)
	end := l.logEnd()
	l.mu.Unlock()
	if err := l.syncTo(end); err != nil {
		return nil, err
	}
	return reply, nil
}

// Release applies one Release call: it credits each listed key's Returned
// up to the caller's holding and charges its Debt, then drops every
// holding of the caller's epoch and closes the epoch. Errors and retries as
// for Acquire.
func (l *Ledger) Release(ctx context.Context, c Caller, keys []ReleaseKey) (*ReleaseReply, error) {
	if err := validateRelease(c, keys); err != nil {
		return nil, err
	}
	d := digestRelease(keys)
	l.mu.Lock()
	stored, s, now, err := l.begin(&c, kindRelease, d)
	if err != nil || stored != nil {
		end := l.logEnd()
		l.mu.Unlock()
		if err != nil {
			return nil, err
		}
		return stored.(*ReleaseReply), l.syncTo(end)
	}
	reply := &ReleaseReply{Returned: make([]ration.Amount, len(keys))}
	for i := range keys {
		l.releaseKey(&keys[i], c, now, &reply.Returned[i])
	}
	for name, ks := range l.keys {
		if i := ks.find(c.SpenderID, c.Epoch); i >= 0 {
			ks.holds = append(ks.holds[:i], ks.holds[i+1:]...)
			l.markKey(name, ks)
		}
	}
	s.released = true
	l.finish(s, c, kindRelease, d, reply, now)
	end := l.logEnd()
	l.mu.Unlock()
	if err := l.syncTo(end); err != nil {
		return nil, err
	}
	return reply, nil
}

// begin runs the exactly-once check with l.mu held. It returns the stored
// reply of a retry (with its session), or the session to apply the call in;
// then c.SpenderID is the session's copy of the id, which the call's new
// holdings share (not the request's memory).
func (l *Ledger) begin(c *Caller, k callKind, d digest) (stored any, s *session, now bucket.Instant, err error) {
	if l.closed {
		return nil, nil, 0, ErrClosed
	}
	s = l.sessions[c.SpenderID]
	stored, err = s.check(*c, k, d)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("allocator: spender %q epoch %d sequence %d: %w", c.SpenderID, c.Epoch, c.Sequence, err)
	}
	if stored != nil {
		return stored, s, 0, nil
	}
	if s == nil {
		s = &session{id: strings.Clone(c.SpenderID)} // not the request's memory
		l.sessions[s.id] = s
	}
	if c.Epoch > s.epoch {
		*s = session{id: s.id, epoch: c.Epoch, acquireReply: s.acquireReply, keys: s.keys} // buffers kept
	}
	c.SpenderID = s.id
	return nil, s, l.now(), nil
}

// finish records the applied call in its session, with l.mu held.
func (l *Ledger) finish(s *session, c Caller, k callKind, d digest, reply any, now bucket.Instant) {
	s.seq, s.kind, s.digest, s.reply, s.seen = c.Sequence, k, d, reply, now
	s.noSnapshots = false
	l.markSession(c.SpenderID, s)
}

// keyFor returns name's state following lim, creating it (full, or empty
// if its state was lost) as needed; nil if lim leaves it unlimited. hint,
// if not nil, is a state that may be name's (a session's cache).
func (l *Ledger) keyFor(name string, lim ration.Limits, now bucket.Instant, hint *keyState) *keyState {
	ks := hint
	if ks == nil || ks.gone || ks.name != name {
		ks = l.keys[name]
	}
	if lim.RPM == 0 && lim.TPM == 0 {
		if ks != nil {
			l.dropKey(name, ks)
		}
		return nil
	}
	if ks == nil {
		ks = &keyState{fresh: true, name: name}
		l.keys[name] = ks
	}
	ks.setLimits(lim, now)
	l.markKey(ks.name, ks) // the key's own string: the log does not keep the request's alive
	return ks
}

// snapshotNow is the snapshot of key name at the clock's now, for a stored
// reply read back from disk (record version 2 leaves snapshots out): the
// key's buckets as they would be after refilling to now, without changing
// them (the level cap is not applied, so Remaining may read a little high
// while spenders hold leases); a key the ledger no longer tracks is full,
// one whose state was lost is empty from the instant it was lost. lim are
// the limits the retry sends, used when the key has none. With l.mu held.
//
// The snapshot is informational (x-ratelimit-* headers): the grants,
// returns and holdings of the stored reply are what exactly-once is about,
// and they are stored in full.
func (l *Ledger) snapshotNow(name string, lim ration.Limits) Snapshot {
	now := l.now()
	var k keyState
	if ks := l.keys[name]; ks != nil && !ks.fresh {
		k.req, k.tok = ks.req, ks.tok // copies: Bucket is a value
	} else {
		if lim.RPM == 0 && lim.TPM == 0 {
			return Snapshot{}
		}
		k.fresh = true
		if ks != nil {
			k.emptyFrom = ks.emptyFrom
		}
		k.setLimits(lim, now)
	}
	k.advance(now)
	return k.snapshot()
}

// dropKey removes key name, whose state is ks, from the ledger.
func (l *Ledger) dropKey(name string, ks *keyState) {
	delete(l.keys, name)
	ks.gone = true
	l.markKey(name, nil)
}

// acquireKey applies one key of an Acquire call; hint as for keyFor. It
// returns the key's state (nil if unlimited).
func (l *Ledger) acquireKey(k *AcquireKey, c Caller, now bucket.Instant, out *AcquireResult, hint *keyState) *keyState {
	ks := l.keyFor(k.Key, k.Limits, now, hint)
	if ks == nil {
		*out = AcquireResult{Status: StatusOK, Granted: k.Want}
		return nil
	}
	ks.touch(now, l.cfg.ttl, l.cfg.strict)
	h := &ks.holds[ks.holdingFor(c.SpenderID, c.Epoch, now)]
	if h.lastSeq >= c.Sequence {
		// Applied before a lost session record: change nothing more.
		*out = AcquireResult{Status: StatusOK, Held: h.held, Snapshot: ks.snapshot(), ActiveSpenders: len(ks.holds)}
		return ks
	}
	out.Returned.Requests = give(&ks.req, &h.held.Requests, k.Returned.Requests)
	out.Returned.Tokens = give(&ks.tok, &h.held.Tokens, k.Returned.Tokens)
	h.held.Requests = min(h.held.Requests, k.Held.Requests)
	h.held.Tokens = min(h.held.Tokens, k.Held.Tokens)
	charge(&ks.req, k.Debt.Requests)
	charge(&ks.tok, k.Debt.Tokens)
	h.rate, h.lastSeq = k.SpendRate, c.Sequence
	h.expiry = max(h.expiry, now.Add(l.cfg.ttl))

	switch {
	case !fits(&ks.req, k.Need.Requests) || !fits(&ks.tok, k.Need.Tokens):
		out.Status = StatusTooLarge
	default:
		w := max(wait(&ks.req, k.Need.Requests), wait(&ks.tok, k.Need.Tokens))
		if w > 0 {
			out.Status, out.RetryAfter = StatusNotCovered, w
			break
		}
		out.Status = StatusOK
		active, rates := len(ks.holds), ks.rateSum()
		out.Granted.Requests = l.grant(&ks.req, &h.held.Requests, k.Want.Requests, k.Need.Requests, k.SpendRate.Requests, rates.Requests, active)
		out.Granted.Tokens = l.grant(&ks.tok, &h.held.Tokens, k.Want.Tokens, k.Need.Tokens, k.SpendRate.Tokens, rates.Tokens, active)
	}
	out.Held = h.held
	out.Snapshot = ks.snapshot()
	out.ActiveSpenders = len(ks.holds)
	return ks
}

func fits(d *dim, n int64) bool { return !d.on || d.b.Fits(n) }

func wait(d *dim, n int64) time.Duration {
	if !d.on {
		return 0
	}
	return d.b.Wait(n)
}

// grant sizes and takes one dimension's grant; need is covered.
func (l *Ledger) grant(d *dim, held *int64, want, need, rate, rateSum int64, active int) int64 {
	if !d.on {
		return want
	}
	avail := d.b.Tokens()
	lim := d.b.Limit()
	g := l.cfg.policy.Grant(Demand{
		Want: want, Need: need, Rate: rate, Held: *held, Available: avail,
		Capacity: lim.Capacity, Refill: lim.Refill, TTL: l.cfg.ttl, Active: active, RateSum: rateSum,
	})
	g = min(max(g, need), max(want, need), avail)
	if g <= 0 {
		return 0
	}
	d.b.Take(g)
	*held += g
	return g
}

func (l *Ledger) reserveKey(k *ReserveKey, c Caller, now bucket.Instant, out *ReserveResult) {
	ks := l.keyFor(k.Key, k.Limits, now, nil)
	if ks == nil {
		*out = ReserveResult{Status: StatusOK}
		return
	}
	ks.touch(now, l.cfg.ttl, l.cfg.strict)
	h := &ks.holds[ks.holdingFor(c.SpenderID, c.Epoch, now)]
	switch {
	case h.lastSeq >= c.Sequence:
		// Applied before a lost session record: the spender must not
		// count on a reservation it cannot prove.
		out.Status = StatusTooLate
	case !fits(&ks.req, k.Cost.Requests) || !fits(&ks.tok, k.Cost.Tokens):
		out.Status = StatusTooLarge
	default:
		w := max(wait(&ks.req, k.Cost.Requests), wait(&ks.tok, k.Cost.Tokens))
		if w > 0 && l.cfg.strict {
			// A reservation that waits is paid by refill still to come, but
			// the strict cap (level + holdings <= C) burns refill while the
			// holdings fill it: if the holdings with this cost exceed C, the
			// refill the wait counts on would be burned, and the reservation
			// must also wait for holdings to expire (docs/bound.md). The
			// default mode's cap leaves rho*TTL of room, which its bound
			// already grants; the property test checks both.
			w = max(w, ks.untilHoldingsFit(k.Cost, now, l.cfg.ttl, l.cfg.strict))
		}
		out.Wait = w
		if w > k.MaxWait {
			out.Status = StatusTooLate
			break
		}
		out.Status = StatusOK
		if ks.req.on {
			ks.req.b.Take(k.Cost.Requests)
			h.held.Requests += k.Cost.Requests
		}
		if ks.tok.on {
			ks.tok.b.Take(k.Cost.Tokens)
			h.held.Tokens += k.Cost.Tokens
		}
		h.lastSeq = c.Sequence
		h.expiry = max(h.expiry, now.Add(w+l.cfg.ttl))
	}
	if h.expiry <= now { // nothing reserved on a new holding: drop it
		ks.expire(now)
		out.Held = ration.Amount{}
	} else {
		out.Held = h.held
	}
	out.Snapshot = ks.snapshot()
	out.ActiveSpenders = len(ks.holds)
}

func (l *Ledger) releaseKey(k *ReleaseKey, c Caller, now bucket.Instant, out *ration.Amount) {
	ks := l.keys[k.Key]
	if ks == nil {
		if k.Debt == (ration.Amount{}) {
			return
		}
		if ks = l.keyFor(k.Key, k.Limits, now, nil); ks == nil {
			return
		}
	} else if k.Limits.RPM != 0 || k.Limits.TPM != 0 {
		ks.setLimits(k.Limits, now)
	}
	l.markKey(k.Key, ks)
	ks.touch(now, l.cfg.ttl, l.cfg.strict)
	if i := ks.find(c.SpenderID, c.Epoch); i >= 0 {
		h := &ks.holds[i]
		out.Requests = give(&ks.req, &h.held.Requests, k.Returned.Requests)
		out.Tokens = give(&ks.tok, &h.held.Tokens, k.Returned.Tokens)
	}
	charge(&ks.req, k.Debt.Requests)
	charge(&ks.tok, k.Debt.Tokens)
}

// Sweep drops what holds no information at the clock's now: expired
// holdings, keys with no holdings whose buckets are full again (they are
// recreated full on their next call), and sessions idle for longer than
// the retention. It returns the number of keys and sessions dropped. Call
// it periodically (cmd/allocator does, every TTL).
func (l *Ledger) Sweep(ctx context.Context) (keys, sessions int, err error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return 0, 0, ErrClosed
	}
	now := l.now()
	for name, ks := range l.keys {
		if ks.fresh {
			continue // state lost at recovery, limits unknown: kept until its next call
		}
		if ks.anyExpired(now) {
			ks.touch(now, l.cfg.ttl, l.cfg.strict)
			l.markKey(name, ks) // touched state must be what is on disk
		}
		if ks.idle(now) {
			l.dropKey(name, ks)
			keys++
		}
	}
	horizon := now.Add(-l.cfg.retention)
	for id, s := range l.sessions {
		if s.seen < horizon {
			delete(l.sessions, id)
			l.markSession(id, nil)
			sessions++
		}
	}
	l.mu.Unlock()
	return keys, sessions, l.sync(ctx)
}

// Stats are counts for metrics.
type Stats struct {
	Keys     int // keys with state in memory
	Sessions int // spenders with an exactly-once record
	Holdings int // (spender, epoch, key) leases not yet expired at the last touch
	Spenders int // distinct spender incarnations among Holdings
}

// Stats returns current counts. It walks every key: call it at scrape
// rate, not per request.
func (l *Ledger) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := Stats{Keys: len(l.keys), Sessions: len(l.sessions)}
	type inc struct {
		id    string
		epoch uint64
	}
	seen := make(map[inc]struct{})
	for _, ks := range l.keys {
		st.Holdings += len(ks.holds)
		for i := range ks.holds {
			seen[inc{ks.holds[i].spender, ks.holds[i].epoch}] = struct{}{}
		}
	}
	st.Spenders = len(seen)
	return st
}

// Close stops the ledger: later calls get ErrClosed. A durable ledger
// waits for commits in progress and closes its store.
func (l *Ledger) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	if l.st != nil {
		return l.st.close()
	}
	return nil
}
