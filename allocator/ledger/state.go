package ledger

import (
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"strings"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// Config is the part of the allocator's configuration the state machine
// follows. Every replica of a State must use the same Config.
type Config struct {
	TTL    time.Duration // lease time to live, 1 ms to 1 h
	Strict bool          // strict mode: level + holdings <= C (bound C + rho*t)
	Policy Policy        // lease sizing; nil: ShareByRate{}
	// SharePolicy splits refill rates into shares; nil:
	// ProportionalShare{Headroom: DefaultShareHeadroom}.
	SharePolicy SharePolicy
	Retention   time.Duration // how long a session outlives its last call; raised to at least 2 TTL
	Quota       Quota         // what one credential's calls may keep in the state; zero: no bound
}

// State is the ledger: every key's global buckets and holdings, and every
// spender's exactly-once session. It changes only through Apply, and it is
// not safe for concurrent use.
type State struct {
	cfg      Config
	keys     map[string]*keyState // by API key
	sessions map[string]*session  // by spender id
	usage    map[string]*usage    // by credential: what its calls keep (Quota)
	loaded   bool                 // records were loaded since the last recount of usage

	changed Changes // what the command being applied changed
}

// Changes names the records a command changed (or dropped), in a
// deterministic order. State.AppendRecords encodes them.
type Changes struct {
	Keys     []string // API keys
	Sessions []string // spender ids
}

// Empty reports whether nothing changed.
func (c Changes) Empty() bool { return len(c.Keys) == 0 && len(c.Sessions) == 0 }

// New returns an empty State.
func New(cfg Config) (*State, error) {
	if cfg.TTL < time.Millisecond || cfg.TTL > time.Hour {
		return nil, fmt.Errorf("allocator: lease TTL %v outside [1ms, 1h]", cfg.TTL)
	}
	if cfg.Policy == nil {
		cfg.Policy = ShareByRate{}
	}
	if cfg.SharePolicy == nil {
		cfg.SharePolicy = ProportionalShare{Headroom: DefaultShareHeadroom}
	}
	cfg.Retention = max(cfg.Retention, 2*cfg.TTL)
	return &State{cfg: cfg, keys: make(map[string]*keyState), sessions: make(map[string]*session), usage: make(map[string]*usage)}, nil
}

// Config returns the state's configuration, with defaults applied.
func (s *State) Config() Config { return s.cfg }

// InstantOf returns t as the ledger's Instant: microseconds since the Unix
// epoch, so that durable state survives restarts.
func InstantOf(t time.Time) bucket.Instant { return bucket.InstantOf(time.Unix(0, 0), t) }

// Command is an input to Apply: Acquire, ReserveAhead, Release or Sweep.
// Each carries the instant it is applied at; time is an input, never read.
type Command interface{ command() }

// Acquire refreshes leases on a batch of keys (LeaseService.Acquire).
type Acquire struct {
	Now    bucket.Instant
	Caller Caller
	Keys   []AcquireKey
}

// ReserveAhead reserves costs for future send times (wait mode).
type ReserveAhead struct {
	Now    bucket.Instant
	Caller Caller
	Keys   []ReserveKey
}

// Release gives back what the caller's epoch holds and closes it.
type Release struct {
	Now    bucket.Instant
	Caller Caller
	Keys   []ReleaseKey
}

// Sweep drops what holds no information at Now: expired holdings, idle
// keys whose buckets are full again, sessions idle beyond the retention.
//
// With Parts above 1 it sweeps one part of the keys only, those whose
// name hashes to Part modulo Parts (and the sessions with part 0), and
// drops at most maxSweepDrops idle keys (the first by name), so that a
// large state is swept in short steps, each its own command, between
// which calls are applied. Parts 0 or 1: everything.
type Sweep struct {
	Now         bucket.Instant
	Part, Parts uint32
}

// maxSweepDrops is the most idle keys a partial Sweep drops: a
// credential's quota of keys going idle at once is dropped, and the quota
// freed to a flood of new keys, a little at a time (16,384 an interval
// with cmd/allocator's 16 parts), which keeps the journal's traffic from
// such a flood low. An idle key holds no information; one kept longer only
// costs its memory, which the quota bounds.
const maxSweepDrops = 1024

// SweepReply counts what a Sweep dropped.
type SweepReply struct {
	Keys, Sessions int
}

func (Acquire) command()      {}
func (ReserveAhead) command() {}
func (Release) command()      {}
func (Sweep) command()        {}

// Apply applies cmd and returns its reply (*AcquireReply, *ReserveReply,
// *ReleaseReply or *SweepReply) and the names of the records it changed.
// The same state and the same commands give the same replies, changes and
// state.
//
// Bad input is an error wrapping ErrInvalidArgument that names the field;
// a stale or conflicting call is ErrStaleEpoch, ErrStaleSequence,
// ErrSequenceReused or ErrEpochReleased; a call under another credential's
// spender id is ErrForeignSpender; one beyond its credential's Quota is a
// *QuotaError (ErrResourceExhausted). Then nothing changes. A retry of
// a session's latest call returns its stored reply and changes nothing.
//
// The reply is the state's: the caller must not modify it (a retry gets
// the same reply).
func (s *State) Apply(cmd Command) (reply any, changed Changes, err error) {
	s.changed = Changes{}
	if s.loaded {
		s.recount()
	}
	switch c := cmd.(type) {
	case Acquire:
		reply, err = s.acquire(c)
	case ReserveAhead:
		reply, err = s.reserve(c)
	case Release:
		reply, err = s.release(c)
	case Sweep:
		if err = Validate(c); err == nil {
			reply = s.sweep(c)
		}
	default:
		err = fmt.Errorf("allocator: unknown command %T", cmd)
	}
	changed, s.changed = s.changed, Changes{}
	if err != nil {
		return nil, Changes{}, err
	}
	return reply, changed, nil
}

// AppendRecords appends to b, as a record batch (see the package function
// AppendRecords), the current state of the records ch names; a key or
// session that no longer exists is a deletion. Called right after the
// Apply that returned ch (a store does, to persist what the command
// changed), it gives the records as that command left them.
func (s *State) AppendRecords(b []byte, ch Changes) []byte {
	e := enc{b: slices.Grow(b, 64*len(ch.Keys)+128*len(ch.Sessions))} // records are a few dozen bytes
	var rec []byte
	for _, name := range ch.Keys {
		if ks := s.keys[name]; ks != nil {
			rec = appendKey(rec[:0], ks)
			e.put(opKeyPut, name, rec)
		} else {
			e.put(opKeyDelete, name, nil)
		}
	}
	for _, id := range ch.Sessions {
		if ss := s.sessions[id]; ss != nil {
			rec = appendSession(rec[:0], ss)
			e.put(opSessionPut, id, rec)
		} else {
			e.put(opSessionDelete, id, nil)
		}
	}
	return e.b
}

func (s *State) markKey(name string) { s.changed.Keys = append(s.changed.Keys, name) }

func (s *State) markSession(id string) { s.changed.Sessions = append(s.changed.Sessions, id) }

// call is what the checks before a call's application (admit) look at:
// its caller, method and body digest, and its keys (one of the three
// lists, by kind), for the quota.
type call struct {
	c       Caller
	kind    callKind
	digest  digest
	acquire []AcquireKey
	reserve []ReserveKey
	release []ReleaseKey
}

func acquireCall(c Acquire) call {
	return call{c: c.Caller, kind: kindAcquire, digest: digestAcquire(c.Keys), acquire: c.Keys}
}

func reserveCall(c ReserveAhead) call {
	return call{c: c.Caller, kind: kindReserve, digest: digestReserve(c.Keys), reserve: c.Keys}
}

func releaseCall(c Release) call {
	return call{c: c.Caller, kind: kindRelease, digest: digestRelease(c.Keys), release: c.Keys}
}

// n is how many keys the call names.
func (cl *call) n() int { return len(cl.acquire) + len(cl.reserve) + len(cl.release) }

// key is key i's name and whether the call would create its state if it
// has none (a Release only to charge a debt).
func (cl *call) key(i int) (name string, creates bool) {
	switch cl.kind {
	case kindAcquire:
		return cl.acquire[i].Key, !cl.acquire[i].Limits.Unlimited()
	case kindReserve:
		return cl.reserve[i].Key, !cl.reserve[i].Limits.Unlimited()
	}
	k := &cl.release[i]
	return k.Key, k.Debt != (ration.Amount{}) && !k.Limits.Unlimited()
}

// leases reports whether the call takes leases (Release drops them).
func (cl *call) leases() bool { return cl.kind != kindRelease }

// Admit returns the error Apply would return for cmd from the checks that
// depend on the state but not on the call's effects: a spender id of
// another credential (ErrForeignSpender), a stale or conflicting call, a
// call beyond its credential's Quota (*QuotaError); nil if Apply would
// apply it or answer it from its stored reply. It changes nothing, so a
// replicated allocator's leader refuses such calls before they take log
// space. Input is not checked (Validate).
func (s *State) Admit(cmd Command) error {
	var cl call
	switch c := cmd.(type) {
	case Acquire:
		cl = acquireCall(c)
	case ReserveAhead:
		cl = reserveCall(c)
	case Release:
		cl = releaseCall(c)
	default:
		return nil
	}
	if s.loaded {
		s.recount()
	}
	_, _, err := s.admit(cl)
	return err
}

// admit checks a call's right to its spender id, the exactly-once record
// and its credential's Quota, changing nothing. It returns the stored
// reply of a retry (with its session), or the session the call would apply
// in (nil: a new one).
func (s *State) admit(cl call) (stored any, ss *session, err error) {
	c := cl.c
	ss = s.sessions[c.SpenderID]
	if ss != nil && !ss.takes(c) {
		return nil, nil, fmt.Errorf("allocator: spender %q: %w", c.SpenderID, ErrForeignSpender)
	}
	stored, err = ss.check(c, cl.kind, cl.digest)
	if err != nil {
		return nil, nil, fmt.Errorf("allocator: spender %q epoch %d sequence %d: %w", c.SpenderID, c.Epoch, c.Sequence, err)
	}
	if stored != nil {
		return stored, ss, nil
	}
	if err := s.overQuota(&cl, ss); err != nil {
		return nil, nil, fmt.Errorf("allocator: spender %q: %w", c.SpenderID, err)
	}
	return nil, ss, nil
}

// begin runs admit and returns the stored reply of a retry (with its
// session), or the session to apply the call in, created, adopted or
// moved to the call's epoch as needed.
func (s *State) begin(cl call) (stored any, ss *session, err error) {
	stored, ss, err = s.admit(cl)
	if err != nil || stored != nil {
		return stored, ss, err
	}
	c := cl.c
	u := s.usageOf(c.Credential)
	if ss == nil {
		ss = &session{id: strings.Clone(c.SpenderID), use: u} // not the request's memory
		s.sessions[ss.id] = ss
		u.sessions++
	} else if ss.use != u { // adopted, or taken over after its Release
		n := answers(ss.reply)
		ss.use.sessions--
		ss.use.answers -= n
		ss.use = u
		u.sessions++
		u.answers += n
	}
	if c.Epoch > ss.epoch {
		s.setReply(ss, nil)
		*ss = session{id: ss.id, use: ss.use, epoch: c.Epoch}
	}
	return nil, ss, nil
}

// setReply makes reply ss's stored reply, counting its key answers
// against ss's credential.
func (s *State) setReply(ss *session, reply any) {
	ss.use.answers += answers(reply) - answers(ss.reply)
	ss.reply = reply
}

// finish records the applied call in its session.
func (s *State) finish(ss *session, cl call, reply any, now bucket.Instant) {
	s.setReply(ss, reply)
	ss.seq, ss.kind, ss.digest, ss.seen = cl.c.Sequence, cl.kind, cl.digest, now
	ss.noSnapshots = false
	s.markSession(ss.id)
}

func (s *State) acquire(c Acquire) (*AcquireReply, error) {
	if err := validateAcquire(c.Caller, c.Keys); err != nil {
		return nil, err
	}
	if err := validateEpoch(c.Caller, c.Now); err != nil {
		return nil, err
	}
	cl := acquireCall(c)
	stored, ss, err := s.begin(cl)
	if err != nil {
		return nil, err
	}
	if stored != nil {
		r := stored.(*AcquireReply)
		s.fillSnapshots(ss, c.Now, len(r.Keys), func(i int) (string, ration.Limits, *Snapshot) {
			return c.Keys[i].Key, c.Keys[i].Limits, &r.Keys[i].Snapshot
		})
		return r, nil
	}
	reply := &AcquireReply{Keys: make([]AcquireResult, len(c.Keys)), LeaseTTL: s.cfg.TTL}
	s.changed.Keys = make([]string, 0, len(c.Keys))
	for i := range c.Keys {
		reply.Keys[i] = s.acquireKey(&c.Keys[i], ss, c.Caller, c.Now)
	}
	s.finish(ss, cl, reply, c.Now)
	return reply, nil
}

func (s *State) reserve(c ReserveAhead) (*ReserveReply, error) {
	if err := validateReserve(c.Caller, c.Keys); err != nil {
		return nil, err
	}
	if err := validateEpoch(c.Caller, c.Now); err != nil {
		return nil, err
	}
	cl := reserveCall(c)
	stored, ss, err := s.begin(cl)
	if err != nil {
		return nil, err
	}
	if stored != nil {
		r := stored.(*ReserveReply)
		s.fillSnapshots(ss, c.Now, len(r.Keys), func(i int) (string, ration.Limits, *Snapshot) {
			return c.Keys[i].Key, c.Keys[i].Limits, &r.Keys[i].Snapshot
		})
		return r, nil
	}
	reply := &ReserveReply{Keys: make([]ReserveResult, len(c.Keys)), LeaseTTL: s.cfg.TTL}
	s.changed.Keys = make([]string, 0, len(c.Keys))
	for i := range c.Keys {
		reply.Keys[i] = s.reserveKey(&c.Keys[i], ss, c.Caller, c.Now)
	}
	s.finish(ss, cl, reply, c.Now)
	return reply, nil
}

func (s *State) release(c Release) (*ReleaseReply, error) {
	if err := validateRelease(c.Caller, c.Keys); err != nil {
		return nil, err
	}
	if err := validateEpoch(c.Caller, c.Now); err != nil {
		return nil, err
	}
	cl := releaseCall(c)
	stored, ss, err := s.begin(cl)
	if err != nil {
		return nil, err
	}
	if stored != nil {
		return stored.(*ReleaseReply), nil
	}
	reply := &ReleaseReply{Returned: make([]ration.Amount, len(c.Keys))}
	changed := make(map[string]bool)
	for i := range c.Keys {
		var ok bool
		reply.Returned[i], ok = s.releaseKey(&c.Keys[i], ss, c.Caller, c.Now)
		changed[c.Keys[i].Key] = changed[c.Keys[i].Key] || ok
	}
	for name, ks := range s.keys {
		if ks.find(c.Caller.SpenderID, c.Caller.Epoch) < 0 {
			continue
		}
		// Brought to now first: until now the holding's share took its
		// part of the refill, which the bucket must not get back.
		ks.touch(c.Now, s.cfg.TTL, s.cfg.Strict)
		ks.dropHoldings(func(h *holding) bool { return h.epoch == c.Caller.Epoch && h.spender == c.Caller.SpenderID })
		changed[name] = true
	}
	for _, name := range slices.Sorted(maps.Keys(changed)) {
		if changed[name] {
			s.markKey(name)
		}
	}
	ss.released = true
	s.finish(ss, cl, reply, c.Now)
	return reply, nil
}

// sweep drops expired holdings, idle keys and sessions past the
// retention, in c's part.
func (s *State) sweep(c Sweep) *SweepReply {
	now := c.Now
	var r SweepReply
	var touched, dropped []string
	type candidate struct {
		name    string
		ks      *keyState
		touched bool
	}
	var idle []candidate
	for name, ks := range s.keys {
		if ks.fresh {
			continue // state lost at recovery, limits unknown: kept until its next call
		}
		if c.Parts > 1 && ks.hash%c.Parts != c.Part {
			continue
		}
		expired := ks.anyExpired(now)
		if expired {
			ks.touch(now, s.cfg.TTL, s.cfg.Strict)
		}
		switch {
		case ks.idle(now):
			idle = append(idle, candidate{name, ks, expired})
		case expired:
			touched = append(touched, name)
		}
	}
	if c.Parts > 1 && len(idle) > maxSweepDrops {
		// The first by name: the same on every replica.
		slices.SortFunc(idle, func(a, b candidate) int { return strings.Compare(a.name, b.name) })
		for _, x := range idle[maxSweepDrops:] {
			if x.touched {
				touched = append(touched, x.name)
			}
		}
		idle = idle[:maxSweepDrops]
	}
	for _, x := range idle {
		s.dropKey(x.name, x.ks)
		dropped = append(dropped, x.name)
	}
	horizon := now.Add(-s.cfg.Retention)
	var gone []string
	for id, ss := range s.sessions {
		if c.Parts > 1 && c.Part != 0 {
			break
		}
		if ss.seen < horizon {
			s.setReply(ss, nil)
			ss.use.sessions--
			delete(s.sessions, id)
			gone = append(gone, id)
		}
	}
	for _, name := range slices.Sorted(slices.Values(append(touched, dropped...))) {
		s.markKey(name)
	}
	slices.Sort(gone)
	for _, id := range gone {
		s.markSession(id)
	}
	r.Keys, r.Sessions = len(dropped), len(gone)
	return &r
}

// keyFor returns name's state following lim, creating it (full, or empty
// if its state was lost; owned by use) as needed, and marks it changed;
// nil if lim leaves the key unlimited (its state, if any, is dropped).
func (s *State) keyFor(name string, lim ration.Limits, use *usage, now bucket.Instant) *keyState {
	ks := s.keys[name]
	if lim.Unlimited() {
		if ks != nil {
			s.dropKey(name, ks)
			s.markKey(name)
		}
		return nil
	}
	if ks == nil {
		ks = s.newKey(name, use)
	}
	s.follow(ks, lim, now)
	s.markKey(name)
	return ks
}

// newKey adds name's state, fresh (limits unknown), owned by use.
func (s *State) newKey(name string, use *usage) *keyState {
	ks := &keyState{fresh: true, owner: use, hash: nameHash(name)}
	use.keys++
	s.keys[strings.Clone(name)] = ks // not the request's memory
	return ks
}

// dropKey removes name's state, uncounting it and its holdings.
func (s *State) dropKey(name string, ks *keyState) {
	ks.dropHoldings(func(*holding) bool { return true })
	if ks.owner != nil {
		ks.owner.keys--
	}
	delete(s.keys, name)
}

// follow makes ks follow lim at now. A key whose limits change is first
// brought to now under the old ones: the refill since its last touch is at
// the old rate less the shares of that time (setLimits alone would refill
// it at the whole old rate, minting what the shares took).
func (s *State) follow(ks *keyState, lim ration.Limits, now bucket.Instant) {
	if !ks.fresh && ks.lim != lim {
		ks.touch(now, s.cfg.TTL, s.cfg.Strict)
	}
	ks.setLimits(lim, now)
}

// fillSnapshots gives a stored reply of n keys that was decoded without
// its snapshots (ss.noSnapshots) each key's snapshot at now; key(i) returns
// key i's name and limits as the retry sends them and where its snapshot
// goes.
func (s *State) fillSnapshots(ss *session, now bucket.Instant, n int, key func(i int) (string, ration.Limits, *Snapshot)) {
	if !ss.noSnapshots {
		return
	}
	for i := range n {
		name, lim, snap := key(i)
		*snap = s.snapshotAt(name, lim, now)
	}
	ss.noSnapshots = false
}

// snapshotAt is the snapshot of key name at now, for a stored reply that
// was decoded without its snapshots: the key's buckets as they would be
// after refilling to now, without changing them (the level cap is not
// applied, so Remaining may read a little high while spenders hold
// leases); a key the state no longer tracks is full, one whose state was
// lost is empty from the instant it was lost. lim are the limits the retry
// sends, used when the key has none.
//
// The snapshot is informational (x-ratelimit-* headers): the grants,
// returns and holdings of the stored reply are what exactly-once is about,
// and they are stored in full.
func (s *State) snapshotAt(name string, lim ration.Limits, now bucket.Instant) Snapshot {
	var k keyState
	if ks := s.keys[name]; ks != nil && !ks.fresh {
		k.req, k.tok = ks.req, ks.tok // copies: Bucket is a value
		// The holdings only read, for the refill their shares take.
		k.lim, k.holds = ks.lim, ks.holds
	} else {
		if lim.Unlimited() {
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

// acquireKey applies one key of an Acquire call in session ss.
func (s *State) acquireKey(k *AcquireKey, ss *session, c Caller, now bucket.Instant) AcquireResult {
	ks := s.keyFor(k.Key, k.Limits, ss.use, now)
	if ks == nil {
		return AcquireResult{Status: StatusOK, Granted: k.Want}
	}
	ks.touch(now, s.cfg.TTL, s.cfg.Strict)
	hi := ks.holdingFor(ss.id, c.Epoch, ss.use, now)
	h := &ks.holds[hi]
	if h.lastSeq >= c.Sequence {
		// Applied before a lost session record: change nothing more.
		return AcquireResult{Status: StatusOK, Held: h.held, Snapshot: ks.snapshot(), ActiveSpenders: len(ks.holds)}
	}
	var out AcquireResult
	out.Returned.Requests = give(&ks.req, &h.held.Requests, k.Returned.Requests)
	out.Returned.Tokens = give(&ks.tok, &h.held.Tokens, k.Returned.Tokens)
	h.held = h.held.Min(k.Held)
	charge(&ks.req, &h.owed.Requests, k.Debt.Requests)
	charge(&ks.tok, &h.owed.Tokens, k.Debt.Tokens)
	h.rate, h.lastSeq = ks.usable(k.SpendRate), c.Sequence
	h.expiry = max(h.expiry, now.Add(s.cfg.TTL))

	switch {
	case !fits(&ks.req, k.Need.Requests) || !fits(&ks.tok, k.Need.Tokens):
		out.Status = StatusTooLarge
	default:
		// The exact wait at the rate the shares leave the bucket: what the
		// spender tells its client (it asks again sooner, at its renewal,
		// in case the shares are split anew).
		free := ks.freeShare()
		w := max(wait(&ks.req, k.Need.Requests, free.Requests, now), wait(&ks.tok, k.Need.Tokens, free.Tokens, now))
		if w > 0 {
			out.Status, out.RetryAfter = StatusNotCovered, w
			break
		}
		out.Status = StatusOK
		active, rates := len(ks.holds), ks.rateSum()
		out.Granted.Requests = s.grant(&ks.req, &h.held.Requests, k.Want.Requests, k.Need.Requests, h.rate.Requests, rates.Requests, active)
		out.Granted.Tokens = s.grant(&ks.tok, &h.held.Tokens, k.Want.Tokens, k.Need.Tokens, h.rate.Tokens, rates.Tokens, active)
	}
	out.Share, out.ShareBurst, out.ShareFair = s.shareKey(ks, hi, k, now)
	out.Held = h.held
	out.Snapshot = ks.snapshot()
	out.ActiveSpenders = len(ks.holds)
	if h.held == (ration.Amount{}) && h.share.Zero() && k.Want == (ration.Amount{}) && k.Need == (ration.Amount{}) && k.Demand == (ration.Amount{}) {
		// A spender that holds nothing and asks for nothing, not even a
		// share, has given the key back (an idle gateway): it is no longer
		// one of the key's active spenders. A repeat of this call after a
		// lost session record can then only be granted from the bucket.
		ks.holds = slices.Delete(ks.holds, hi, hi+1)
	}
	return out
}

// usable is a reported spend rate per minute, at most what the key can
// admit in a minute in each dimension: its capacity and a minute's refill.
func (k *keyState) usable(rate ration.Amount) ration.Amount {
	perMinute := func(d *dim, r int64) int64 {
		if !d.on {
			return r
		}
		lim := d.b.Limit()
		// Refill <= MaxRate and Period >= 1 s: the quotient is at most
		// 60 MaxRate, and the division cannot overflow.
		hi, lo := bits.Mul64(uint64(lim.Refill), uint64(time.Minute))
		refill, _ := bits.Div64(hi, lo, uint64(lim.Period))
		return min(r, lim.Capacity+int64(refill))
	}
	return ration.Amount{Requests: perMinute(&k.req, rate.Requests), Tokens: perMinute(&k.tok, rate.Tokens)}
}

func fits(d *dim, n int64) bool { return !d.on || d.b.Fits(n) }

// wait is how long after now d's bucket takes to cover n at the free part
// of its refill rate (millionths; the rest refills spenders' shares),
// counting a refill that starts later (a key whose state was lost).
func wait(d *dim, n int64, free uint32, now bucket.Instant) time.Duration {
	if !d.on {
		return 0
	}
	w := d.b.WaitFraction(n, uint64(free), ration.ShareUnit)
	if later := d.b.Last().Sub(now); w > 0 && later > 0 {
		w = min(w, bucket.InfDuration-later) + later
	}
	return w
}

// grant sizes and takes one dimension's grant; need is covered.
func (s *State) grant(d *dim, held *int64, want, need, rate, rateSum int64, active int) int64 {
	if !d.on {
		return want
	}
	avail := d.b.Tokens()
	lim := d.b.Limit()
	g := s.cfg.Policy.Grant(Demand{
		Want: want, Need: need, Rate: rate, Held: *held, Available: avail,
		Capacity: lim.Capacity, Refill: lim.Refill, TTL: s.cfg.TTL, Active: active, RateSum: rateSum,
	})
	g = min(max(g, need), max(want, need), avail)
	if g <= 0 {
		return 0
	}
	d.b.Take(g)
	*held += g
	return g
}

func (s *State) reserveKey(k *ReserveKey, ss *session, c Caller, now bucket.Instant) ReserveResult {
	ks := s.keyFor(k.Key, k.Limits, ss.use, now)
	if ks == nil {
		return ReserveResult{Status: StatusOK}
	}
	ks.touch(now, s.cfg.TTL, s.cfg.Strict)
	h := &ks.holds[ks.holdingFor(ss.id, c.Epoch, ss.use, now)]
	var out ReserveResult
	switch {
	case h.lastSeq >= c.Sequence:
		// Applied before a lost session record: the spender must not
		// count on a reservation it cannot prove.
		out.Status = StatusTooLate
	case !fits(&ks.req, k.Cost.Requests) || !fits(&ks.tok, k.Cost.Tokens):
		out.Status = StatusTooLarge
	default:
		free := ks.freeShare()
		w := max(wait(&ks.req, k.Cost.Requests, free.Requests, now), wait(&ks.tok, k.Cost.Tokens, free.Tokens, now))
		if w > 0 && s.cfg.Strict {
			// A reservation that waits is paid by refill still to come, but
			// the strict cap (level + holdings <= C) burns refill while the
			// holdings fill it: if the holdings with this cost exceed C, the
			// refill the wait counts on would be burned, and the reservation
			// must also wait for holdings to expire (docs/bound.md). The
			// default mode's cap leaves rho*TTL of room, which its bound
			// already grants; the property test checks both.
			w = max(w, ks.untilHoldingsFit(k.Cost, now, s.cfg.TTL, s.cfg.Strict))
		}
		out.Wait = w
		if w > k.MaxWait {
			out.Status = StatusTooLate
			break
		}
		out.Status = StatusOK
		// The reservation is held on top of what a share may grow to, so
		// the growth limit moves with it (the spender's own accrual limit
		// does not count reservations made ahead).
		if ks.req.on {
			ks.req.b.Take(k.Cost.Requests)
			h.held.Requests += k.Cost.Requests
			if h.growTo.Requests > 0 {
				h.growTo.Requests += k.Cost.Requests
			}
		}
		if ks.tok.on {
			ks.tok.b.Take(k.Cost.Tokens)
			h.held.Tokens += k.Cost.Tokens
			if h.growTo.Tokens > 0 {
				h.growTo.Tokens += k.Cost.Tokens
			}
		}
		h.lastSeq = c.Sequence
		h.expiry = max(h.expiry, now.Add(w+s.cfg.TTL))
	}
	if h.expiry <= now { // nothing reserved on a new holding: drop it
		ks.expire(now)
	} else {
		out.Held = h.held
	}
	out.Snapshot = ks.snapshot()
	out.ActiveSpenders = len(ks.holds)
	return out
}

// releaseKey credits one listed key's return and charges its debt. It
// reports what was credited and whether the key's state changed.
func (s *State) releaseKey(k *ReleaseKey, ss *session, c Caller, now bucket.Instant) (ration.Amount, bool) {
	ks := s.keys[k.Key]
	if ks == nil {
		if k.Debt == (ration.Amount{}) || k.Limits.Unlimited() {
			return ration.Amount{}, false
		}
		ks = s.newKey(k.Key, ss.use)
	}
	if !k.Limits.Unlimited() {
		s.follow(ks, k.Limits, now)
	}
	ks.touch(now, s.cfg.TTL, s.cfg.Strict)
	var out, owed ration.Amount // the holding is dropped: nothing to mark
	if i := ks.find(c.SpenderID, c.Epoch); i >= 0 {
		h := &ks.holds[i]
		out.Requests = give(&ks.req, &h.held.Requests, k.Returned.Requests)
		out.Tokens = give(&ks.tok, &h.held.Tokens, k.Returned.Tokens)
	}
	charge(&ks.req, &owed.Requests, k.Debt.Requests)
	charge(&ks.tok, &owed.Tokens, k.Debt.Tokens)
	return out, true
}

// Stats are counts for metrics.
type Stats struct {
	Keys     int // keys with state
	Sessions int // spenders with an exactly-once record
	Holdings int // (spender, epoch, key) leases not yet expired at the last touch
	Spenders int // distinct spender incarnations among Holdings
	Shared   int // Holdings with a refill share
}

// Stats returns current counts. It walks every key.
func (s *State) Stats() Stats {
	st := Stats{Keys: len(s.keys), Sessions: len(s.sessions)}
	type inc struct {
		id    string
		epoch uint64
	}
	seen := make(map[inc]struct{})
	for _, ks := range s.keys {
		st.Holdings += len(ks.holds)
		for _, h := range ks.holds {
			seen[inc{h.spender, h.epoch}] = struct{}{}
			if !h.share.Zero() {
				st.Shared++
			}
		}
	}
	st.Spenders = len(seen)
	return st
}
