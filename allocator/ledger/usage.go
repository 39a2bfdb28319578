package ledger

import "slices"

// Quota bounds what the calls of one credential (Caller.Credential) may
// keep in the state, so that one client's flood cannot take the memory and
// disk every client shares. A call that would go beyond it is refused with
// a *QuotaError (ErrResourceExhausted) and changes nothing. 0 in a field
// means no bound.
type Quota struct {
	// Sessions bounds the spender ids with an exactly-once session.
	Sessions int
	// Keys bounds, each on its own: the keys the credential's calls
	// created that the state still tracks (a key outlives its leases until
	// its buckets are full again), the leases (key, spender incarnation)
	// its spenders hold, and the key answers its sessions keep for retries
	// (a session keeps its last call's, at most ration.MaxBatch).
	Keys int
}

// usage is what one credential's calls keep in the state: its counts
// against the Quota. Sessions, holdings and keys point at their
// credential's usage. Entries are never dropped: there are as many as
// credentials, which the allocator's token files bound.
type usage struct {
	cred     string
	sessions int // sessions whose use is this
	keys     int // keys whose owner is this
	leases   int // holdings whose use is this
	answers  int // key answers in the stored replies of its sessions
}

// usageOf returns cred's usage, creating it.
func (s *State) usageOf(cred string) *usage {
	u := s.usage[cred]
	if u == nil {
		u = &usage{cred: cred}
		s.usage[cred] = u
	}
	return u
}

// answers is how many key answers a stored reply holds.
func answers(reply any) int {
	switch r := reply.(type) {
	case *AcquireReply:
		return len(r.Keys)
	case *ReserveReply:
		return len(r.Keys)
	case *ReleaseReply:
		return len(r.Returned)
	}
	return 0
}

// recount rebuilds every usage from the state after records were loaded:
// a session's credential is its record's, a key's owner its record's, and
// a holding counts against its spender's session's credential (none when
// the session is gone).
func (s *State) recount() {
	clear(s.usage)
	for _, ss := range s.sessions {
		ss.use = s.usageOf(ss.use.cred)
		ss.use.sessions++
		ss.use.answers += answers(ss.reply)
	}
	for _, ks := range s.keys {
		if ks.owner != nil {
			ks.owner = s.usageOf(ks.owner.cred)
			ks.owner.keys++
		}
		for i := range ks.holds {
			h := &ks.holds[i]
			cred := ""
			if ss := s.sessions[h.spender]; ss != nil {
				cred = ss.use.cred
			}
			h.use = s.usageOf(cred)
			h.use.leases++
		}
	}
	s.loaded = false
}

// overQuota returns the *QuotaError for call cl on the session ss it would
// apply in (nil: a new one), or nil if it fits: the sessions, keys, leases
// and stored answers it could add, counted against what its credential
// keeps.
func (s *State) overQuota(cl *call, ss *session) error {
	q := s.cfg.Quota
	if q == (Quota{}) {
		return nil
	}
	c, n := cl.c, cl.n()
	u := s.usage[c.Credential]
	if u == nil {
		u = &usage{cred: c.Credential}
	}
	var old int // answers the call's reply replaces
	if ss != nil && ss.use == u {
		old = answers(ss.reply)
	} else if q.Sessions > 0 && u.sessions+1 > q.Sessions {
		return &QuotaError{What: "sessions", Limit: q.Sessions}
	}
	if q.Keys <= 0 {
		return nil
	}
	if u.answers-old+n > q.Keys {
		return &QuotaError{What: "stored answers", Limit: q.Keys}
	}
	if u.keys+n <= q.Keys && (!cl.leases() || u.leases+n <= q.Keys) {
		return nil // within the quota whatever the call creates
	}
	var keys, held int
	for i := range n {
		name, creates := cl.key(i)
		ks := s.keys[name]
		if ks == nil && creates {
			keys++
		}
		if cl.leases() && (ks == nil || ks.find(c.SpenderID, c.Epoch) < 0) {
			held++
		}
	}
	switch {
	case u.keys+keys > q.Keys:
		return &QuotaError{What: "keys", Limit: q.Keys}
	case u.leases+held > q.Keys:
		return &QuotaError{What: "leases", Limit: q.Keys}
	}
	return nil
}

// dropHoldings removes the holdings drop selects from k, uncounting them.
func (k *keyState) dropHoldings(drop func(h *holding) bool) {
	k.holds = slices.DeleteFunc(k.holds, func(h holding) bool {
		if !drop(&h) {
			return false
		}
		if h.use != nil {
			h.use.leases--
		}
		return true
	})
}
