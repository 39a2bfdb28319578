package boundcheck

import (
	"fmt"
	"slices"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
)

// Acquire has spender s acquire on a random subset of the keys (if any)
// and sends the call.
func (m *Model) Acquire(s *Spender) {
	if m.PrepareAcquire(s) != nil {
		m.Send(s)
	}
}

// PrepareAcquire draws spender s's next Acquire on a random subset of the
// keys: what it wants, needs, spends and demands, what it returns and
// holds, and an overrun it reports as debt (admitted now). It records the
// call as s's latest and returns it, or returns nil when no key was drawn.
// The spender's shares on the call's keys stop accruing until the reply
// is received.
func (m *Model) PrepareAcquire(s *Spender) *Call {
	t := m.t
	var keys []ledger.AcquireKey
	for k, pk := range m.keys {
		if !t.Bool("include") {
			continue
		}
		ak := ledger.AcquireKey{Key: pk.Name, Limits: pk.Limits, Want: t.Amount(400, "want")}
		if t.IntRange(0, 3, "needs") == 0 {
			ak.Need = t.Amount(150, "need")
		}
		ak.SpendRate = t.Amount(600, "rate")
		if t.IntRange(0, 2, "demands") > 0 {
			ak.Demand = t.Amount(3000, "demand")
		}
		// The held report counts what the share added up to now, and the
		// share stops until the reply is received.
		m.accrue(s, k, m.Now())
		s.share[k].paused = true
		if s.liar {
			ak.Returned = ration.Amount{Requests: s.pool[k].Requests + t.Int64Range(0, 50, "xr"), Tokens: s.pool[k].Tokens + t.Int64Range(0, 500, "xt")}
			ak.Held = t.Amount(1000, "lie")
			s.pool[k] = ration.Amount{}
		} else {
			ret := ration.Amount{Requests: t.Int64Range(0, s.pool[k].Requests, "rr"), Tokens: t.Int64Range(0, s.pool[k].Tokens, "rt")}
			ak.Returned = ret
			s.pool[k].Requests -= ret.Requests
			s.pool[k].Tokens -= ret.Tokens
			p := s.pendingOn(k)
			ak.Held = ration.Amount{Requests: s.pool[k].Requests + p.Requests, Tokens: s.pool[k].Tokens + p.Tokens}
			if t.IntRange(0, 5, "overrun") == 0 {
				ak.Debt = t.Amount(30, "debt")
				m.adm = append(m.adm, admission{at: m.Now(), key: k, amt: ak.Debt})
				m.debt[k].Requests += ak.Debt.Requests
				m.debt[k].Tokens += ak.Debt.Tokens
			}
		}
		keys = append(keys, ak)
	}
	if len(keys) == 0 {
		return nil
	}
	s.seq += uint64(t.IntRange(1, 2, "seqstep"))
	s.last = &Call{kind: kindAcquire, Caller: s.caller(), Acquire: keys, sent: m.Now()}
	return s.last
}

// Reserve has spender s (unless a liar) reserve ahead on a random key and
// sends the call.
func (m *Model) Reserve(s *Spender) {
	if m.PrepareReserve(s) != nil {
		m.Send(s)
	}
}

// PrepareReserve draws spender s's next ReserveAhead on one key (a cost
// and a longest wait), records it as s's latest call and returns it; a
// liar makes none (nil).
func (m *Model) PrepareReserve(s *Spender) *Call {
	if s.liar {
		return nil
	}
	t := m.t
	k := t.IntRange(0, len(m.keys)-1, "rk")
	rk := ledger.ReserveKey{Key: m.keys[k].Name, Limits: m.keys[k].Limits, Cost: t.Amount(150, "cost"),
		MaxWait: time.Duration(t.Int64Range(0, 20, "maxwait")) * time.Second}
	s.seq++
	s.last = &Call{kind: kindReserve, Caller: s.caller(), Reserve: []ledger.ReserveKey{rk}, sent: m.Now()}
	return s.last
}

// Retry sends spender s's latest call again if its reply was not received.
func (m *Model) Retry(s *Spender) {
	if s.Waiting() {
		m.Send(s)
	}
}

// Send sends spender s's latest call through the Ledger and hands the
// reply, if the call was applied, to Answer.
func (m *Model) Send(s *Spender) {
	reply, applied := m.ledger.Send(s, s.last)
	if applied {
		m.Answer(s, reply)
	}
}

// Answer takes the ledger's reply to spender s's latest call. A retry must
// get exactly the stored reply (after Restarted, all of it but the
// snapshots); a fresh reply is checked (grants within want and need,
// returns that do not mint). Then a draw decides whether the reply is lost
// on the way; if not, the spender gets it (once).
func (m *Model) Answer(s *Spender, reply any) {
	c := s.last
	s.applied = c.Caller.Sequence
	if c.reply != nil {
		// A retry must get exactly the stored reply; after a restart, all of
		// it but the snapshots (informational, recomputed from the key).
		if fmt.Sprint(reply) != fmt.Sprint(c.reply) && (!c.restored || SansSnapshots(reply) != SansSnapshots(c.reply)) {
			m.t.Fatalf("retry reply %v, want stored %v", reply, c.reply)
		}
	} else {
		c.reply = reply
		m.observe(s, c)
	}
	if m.t.IntRange(0, 3, "drop") == 0 {
		return // reply lost
	}
	if !c.received {
		c.received = true
		m.deliver(s, c)
	}
}

// observe checks a fresh reply (whether or not the spender gets it).
func (m *Model) observe(s *Spender, c *Call) {
	switch r := c.reply.(type) {
	case *ledger.AcquireReply:
		for i, ak := range c.Acquire {
			k := keyIndex(ak.Key)
			g := r.Keys[i]
			if g.Granted.Requests > max(ak.Want.Requests, ak.Need.Requests) || g.Granted.Tokens > max(ak.Want.Tokens, ak.Need.Tokens) {
				m.t.Fatalf("granted %+v beyond want %+v / need %+v", g.Granted, ak.Want, ak.Need)
			}
			if g.Status == ledger.StatusOK && (g.Granted.Requests < ak.Need.Requests || g.Granted.Tokens < ak.Need.Tokens) {
				m.t.Fatalf("granted %+v below need %+v", g.Granted, ak.Need)
			}
			m.checkReturn(s, s.epoch, k, g.Returned, g.Held, m.Now().Add(TTL), g.Share, g.ShareBurst)
		}
	case *ledger.ReserveReply:
		for i, rk := range c.Reserve {
			k := keyIndex(rk.Key)
			g := r.Keys[i]
			exp := m.Now()
			// A reservation keeps the share; its cost is held on top of
			// what the share may grow to.
			v := s.viewOf(s.epoch)[k]
			sh, burst := v.share, v.burst
			if v.exp <= m.Now() {
				sh, burst = ration.Share{}, ration.Amount{}
			}
			if g.Status == ledger.StatusOK {
				exp = m.Now().Add(g.Wait + TTL)
				if burst.Requests > 0 {
					burst.Requests += rk.Cost.Requests
				}
				if burst.Tokens > 0 {
					burst.Tokens += rk.Cost.Tokens
				}
			}
			m.checkReturn(s, s.epoch, k, ration.Amount{}, g.Held, exp, sh, burst)
		}
	default:
		m.t.Fatalf("reply %T to %+v, want an Acquire or ReserveAhead reply", c.reply, c.Caller)
	}
}

// deliver hands a reply to the model spender.
func (m *Model) deliver(s *Spender, c *Call) {
	switch r := c.reply.(type) {
	case *ledger.AcquireReply:
		for i, ak := range c.Acquire {
			k := keyIndex(ak.Key)
			if s.exp[k] <= m.Now() {
				s.pool[k] = ration.Amount{}
			}
			g := r.Keys[i].Granted
			s.pool[k].Requests += g.Requests
			s.pool[k].Tokens += g.Tokens
			// Held is authoritative: keep at most Held minus what is
			// reserved and not yet sent.
			p := s.pendingOn(k)
			s.pool[k].Requests = max(0, min(s.pool[k].Requests, r.Keys[i].Held.Requests-p.Requests))
			s.pool[k].Tokens = max(0, min(s.pool[k].Tokens, r.Keys[i].Held.Tokens-p.Tokens))
			s.exp[k] = c.sent.Add(r.LeaseTTL) // valid from first send
			s.share[k] = s.share[k].Renewed(r.Keys[i].Share, r.Keys[i].ShareBurst, m.Now())
		}
	case *ledger.ReserveReply:
		for i, rk := range c.Reserve {
			// Send no earlier than receipt + wait (receipt is now), and only
			// while the reservation is usable: until first send + wait +
			// TTL (the protocol). A reply that arrives after that (a retry
			// answered late from the record) is not used.
			if r.Keys[i].Status == ledger.StatusOK && m.Now() < c.sent.Add(r.LeaseTTL) {
				s.pending = append(s.pending, pendingRes{key: keyIndex(rk.Key), amt: rk.Cost, at: m.Now().Add(r.Keys[i].Wait)})
			}
		}
	}
}

// Consume has a random spender (unless a liar) admit a random part of its
// pool on a random key whose lease is valid.
func (m *Model) Consume() {
	t := m.t
	s := m.spenders[t.IntRange(0, len(m.spenders)-1, "who")]
	if s.liar {
		return
	}
	k := t.IntRange(0, len(m.keys)-1, "ck")
	if s.exp[k] <= m.Now() {
		return
	}
	m.accrue(s, k, m.Now())
	a := ration.Amount{Requests: t.Int64Range(0, s.pool[k].Requests, "cr"), Tokens: t.Int64Range(0, s.pool[k].Tokens, "ct")}
	s.pool[k].Requests -= a.Requests
	s.pool[k].Tokens -= a.Tokens
	m.adm = append(m.adm, admission{at: m.Now(), key: k, amt: a})
}

// Release has spender s release its epoch: each key listed (its pool
// given back; a liar claims more) or not (dropped, nothing credited). The
// credited returns are checked, and the spender starts a new epoch.
func (m *Model) Release(s *Spender) {
	var keys []ledger.ReleaseKey
	var listed []int
	for k, pk := range m.keys {
		if !m.t.Bool("listed") {
			continue
		}
		ret := s.pool[k]
		if s.liar {
			ret.Tokens += 100
		}
		keys = append(keys, ledger.ReleaseKey{Key: pk.Name, Limits: pk.Limits, Returned: ret})
		listed = append(listed, k)
	}
	s.seq++
	r := m.ledger.Release(s.caller(), keys)
	for i, k := range listed {
		m.checkReturn(s, s.epoch, k, r.Returned[i], ration.Amount{}, 0, ration.Share{}, ration.Amount{})
	}
	for k := range m.keys {
		s.viewOf(s.epoch)[k] = heldView{}
	}
	m.NewEpoch(s)
}

// SansSnapshots prints an Acquire or ReserveAhead reply without its
// snapshots, which a retry answered after a restart gets recomputed; any
// other reply as it is.
func SansSnapshots(r any) string {
	switch r := r.(type) {
	case *ledger.AcquireReply:
		c := *r
		c.Keys = sansSnapshots(r.Keys, func(k *ledger.AcquireResult) *ledger.Snapshot { return &k.Snapshot })
		return fmt.Sprint(c)
	case *ledger.ReserveReply:
		c := *r
		c.Keys = sansSnapshots(r.Keys, func(k *ledger.ReserveResult) *ledger.Snapshot { return &k.Snapshot })
		return fmt.Sprint(c)
	}
	return fmt.Sprint(r)
}

// sansSnapshots is a copy of keys with each one's snapshot zeroed.
func sansSnapshots[K any](keys []K, snap func(*K) *ledger.Snapshot) []K {
	c := slices.Clone(keys)
	for i := range c {
		*snap(&c[i]) = ledger.Snapshot{}
	}
	return c
}
