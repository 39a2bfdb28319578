package spender

import (
	"hash/maphash"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
	"github.com/rationhq/ration/spender/internal/lease"
)

// keyState is one key's state. It is guarded by its shard's mutex.
type keyState struct {
	// key, lk, sh and next come first: with Lim, what a leased key's turn
	// reads of its state, in one or two cache lines.
	key string
	// lk is the lease state of a leased Limiter's key (nil when
	// standalone).
	lk   *lease.Key
	sh   *shard
	next *keyState // the next state whose key has the same hash
	// Buckets are a standalone key's pair of buckets (Lim, Req, Tok); a
	// dimension whose rate is 0 has no bucket and is never consulted. A
	// leased key keeps only its limits here: its budget is lk.
	lease.Buckets
	// wait is closed when the next Acquire carrying a leased key ends (nil
	// while no Reserve waits for one).
	wait chan struct{}
	// kl is an immutable copy of a standalone key's limits and buckets'
	// parameters that reservations point to for their Status; a limit
	// change makes a new one. (A leased key's reservations keep its
	// lease.Basis.)
	kl *keyLimits
	// dead is set when the shard dropped this state (its buckets were full);
	// a reservation that still points here looks the key up again.
	dead bool
}

// hash returns the maphash of st's key under the Limiter's seed (not kept
// in the state: only rare paths need it again, and 8 bytes less keeps a
// leased key in a smaller size class).
func (st *keyState) hash() uint64 { return maphash.String(st.sh.l.seed, st.key) }

// keyLimits is an immutable copy of a standalone key's limits and of its
// buckets' fixed-point parameters (their levels are not used).
// A Reservation keeps a pointer to it and the levels it left, and computes
// its Status only when asked, without the key's lock: admission does no
// division for headers nobody may read.
type keyLimits struct {
	lim     ration.Limits
	buckets *[2]bucket.Bucket // requests, tokens
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
	*st = keyState{sh: sh, key: key, Buckets: lease.NewBuckets(lim, now)}
	st.kl = sk.sl.set(lim, st.Req, st.Tok)
	return st
}

// setLimits makes the buckets follow new, valid limits without minting
// (see lease.Buckets.SetLimits).
func (st *keyState) setLimits(lim ration.Limits, now bucket.Instant) {
	st.SetLimits(lim, now)
	st.kl = new(standaloneLimits).set(lim, st.Req, st.Tok)
}

// status reports the buckets as a client should see them (as of the last
// advance).
func (st *keyState) status() Status { return statusOf(st.Lim, &st.Req, &st.Tok) }

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
	if st.lk != nil {
		return st.lk.Droppable(now)
	}
	return st.FullAt() <= now
}
