package spender

import (
	"hash/maphash"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// keyState is one key's pair of buckets. It is guarded by its shard's
// mutex. A dimension whose rate is 0 has no bucket and is never consulted.
type keyState struct {
	key string
	lim ration.Limits
	// ls is the lease state of a leased Limiter's key (nil when
	// standalone); req and tok then serve only as fallback buckets.
	ls *leaseState
	// kl is an immutable copy of lim (and, standalone, of the buckets'
	// parameters) that reservations point to for their Status; a limit
	// change makes a new one.
	kl       *keyLimits
	req, tok bucket.Bucket // valid only while lim.RPM > 0, lim.TPM > 0
	// dead is set when the shard dropped this state (its buckets were full);
	// a reservation that still points here looks the key up again.
	dead bool

	sh   *shard
	next *keyState // the next state whose key has the same hash
}

// hash returns the maphash of st's key under the Limiter's seed (not kept
// in the state: only rare paths need it again, and 8 bytes less keeps a
// leased key in a smaller size class).
func (st *keyState) hash() uint64 { return maphash.String(st.sh.l.seed, st.key) }

// keyLimits is an immutable copy of a key's limits and, for a standalone
// key, of its buckets' fixed-point parameters (their levels are not used).
// A Reservation keeps a pointer to it and the levels it left, and computes
// its Status only when asked, without the key's lock: admission does no
// division for headers nobody may read.
type keyLimits struct {
	lim     ration.Limits
	buckets *[2]bucket.Bucket // requests, tokens; nil for a leased key, whose Status needs only lim
}

// standaloneLimits is a standalone key's keyLimits with its bucket copies,
// in one allocation.
type standaloneLimits struct {
	kl      keyLimits
	buckets [2]bucket.Bucket
}

// set makes sl an immutable copy of lim and of req's and tok's parameters
// and returns its keyLimits.
func (sl *standaloneLimits) set(lim ration.Limits, req, tok bucket.Bucket) *keyLimits {
	sl.buckets = [2]bucket.Bucket{req, tok}
	sl.kl = keyLimits{lim: lim, buckets: &sl.buckets}
	return &sl.kl
}

// newKeyState returns full buckets for lim at now. lim must be valid.
func newKeyState(sh *shard, key string, lim ration.Limits, now bucket.Instant) *keyState {
	// One allocation for the state and its first limits.
	sk := &struct {
		keyState
		sl standaloneLimits
	}{}
	st := &sk.keyState
	*st = keyState{sh: sh, key: key, lim: lim}
	if bl, ok := lim.RequestLimit(); ok {
		st.req, _ = bucket.New(bl, now)
	}
	if bl, ok := lim.TokenLimit(); ok {
		st.tok, _ = bucket.New(bl, now)
	}
	st.kl = sk.sl.set(lim, st.req, st.tok)
	return st
}

// setLimits makes the buckets follow new, valid limits without minting: a
// limited dimension keeps its level (capped at the new capacity), a newly
// limited one starts full, a newly unlimited one drops its bucket.
func (st *keyState) setLimits(lim ration.Limits, now bucket.Instant) {
	follow := func(b *bucket.Bucket, was bool, bl bucket.Limit, is bool) {
		switch {
		case is && was:
			_ = b.SetLimit(bl, now) // bl was validated by the caller
		case is:
			*b, _ = bucket.New(bl, now)
		default:
			*b = bucket.Bucket{}
		}
	}
	rl, rok := lim.RequestLimit()
	tl, tok := lim.TokenLimit()
	follow(&st.req, st.lim.RPM > 0, rl, rok)
	follow(&st.tok, st.lim.TPM > 0, tl, tok)
	st.lim = lim
	st.kl = new(standaloneLimits).set(lim, st.req, st.tok)
}

// advance refills both buckets to now.
func (st *keyState) advance(now bucket.Instant) {
	if st.lim.RPM > 0 {
		st.req.Advance(now)
	}
	if st.lim.TPM > 0 {
		st.tok.Advance(now)
	}
}

// wait returns how long until c is covered in every dimension (as of the
// last advance), the dimension that waits longest, and whether c fits at
// all; when it does not, dim is the dimension it exceeds.
func (st *keyState) wait(c ration.Amount) (w time.Duration, dim Dimension, fits bool) {
	dim = Requests
	if st.lim.RPM > 0 {
		if !st.req.Fits(c.Requests) {
			return 0, Requests, false
		}
		w = st.req.Wait(c.Requests)
	}
	if st.lim.TPM > 0 {
		if !st.tok.Fits(c.Tokens) {
			return 0, Tokens, false
		}
		if wt := st.tok.Wait(c.Tokens); st.lim.RPM == 0 || wt > w {
			w, dim = wt, Tokens
		}
	}
	return w, dim, true
}

// take removes c from both buckets (levels may go negative).
func (st *keyState) take(c ration.Amount) {
	if st.lim.RPM > 0 {
		st.req.Take(c.Requests)
	}
	if st.lim.TPM > 0 {
		st.tok.Take(c.Tokens)
	}
}

// give returns c to both buckets, capped at capacity.
func (st *keyState) give(c ration.Amount) {
	if st.lim.RPM > 0 {
		st.req.Give(c.Requests)
	}
	if st.lim.TPM > 0 {
		st.tok.Give(c.Tokens)
	}
}

// status reports the buckets as a client should see them (as of the last
// advance).
func (st *keyState) status() Status { return statusOf(st.lim, &st.req, &st.tok) }

// levels returns both buckets' levels in fixed-point units (0 for an
// unlimited dimension), for keyLimits.status.
func (st *keyState) levels() (req, tok int64) {
	if st.lim.RPM > 0 {
		req, _ = st.req.Level()
	}
	if st.lim.TPM > 0 {
		tok, _ = st.tok.Level()
	}
	return req, tok
}

// status is what keyState.status reported when the buckets held levels
// req and tok.
func (kl *keyLimits) status(req, tok int64) Status {
	r, t := kl.buckets[0].WithLevel(req), kl.buckets[1].WithLevel(tok)
	return statusOf(kl.lim, &r, &t)
}

// statusOf reports buckets req and tok of a key with limits lim.
func statusOf(lim ration.Limits, req, tok *bucket.Bucket) Status {
	var s Status
	if lim.RPM > 0 {
		s.LimitRequests = req.Limit().Capacity
		s.RemainingRequests = max(0, req.Tokens())
		s.ResetRequests = req.TimeToFull()
	}
	if lim.TPM > 0 {
		s.LimitTokens = tok.Limit().Capacity
		s.RemainingTokens = max(0, tok.Tokens())
		s.ResetTokens = tok.TimeToFull()
	}
	return s
}

// droppable reports whether the state carries no information at now and
// may be dropped: standalone buckets full again, or a lease state holding
// nothing.
func (st *keyState) droppable(now bucket.Instant) bool {
	if st.ls != nil {
		// Fallback buckets are kept across flapping outages until they are
		// full again, so that each outage does not restart with a burst.
		fb := keyState{lim: st.ls.fbLim, req: st.req, tok: st.tok}
		return st.ls.idle(now) && (!st.ls.fallback || fb.fullAt() <= now)
	}
	return st.fullAt() <= now
}

// fullAt returns the instant from which both buckets are full, so the
// state carries no information and may be dropped.
func (st *keyState) fullAt() bucket.Instant {
	var at bucket.Instant = -1 << 63
	if st.lim.RPM > 0 {
		at = st.req.FullAt()
	}
	if st.lim.TPM > 0 {
		at = max(at, st.tok.FullAt())
	}
	return at
}
