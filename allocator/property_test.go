package allocator

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/bucket"
	bolt "go.etcd.io/bbolt"
	"pgregory.net/rapid"
)

// The property test drives a durable ledger with random calls from model
// spenders over a lossy network (dropped replies, retries, stale
// duplicates, commits that fail like a crash) with allocator and spender
// restarts in between, and checks after every step, for every key and
// dimension:
//
//   - the bound: for every window [a, b] ending now, what spenders
//     admitted in it plus what they could still admit at b is at most
//     C + rho*(b - a + TTL) (C + rho*(b - a) in strict mode) plus the debt
//     reported so far;
//   - returns never exceed holdings: a credited return is at most what the
//     ledger's previous reply said the spender held, and 0 once that
//     holding has expired.
//
// The model spenders only use what replies they received told them; the
// checks use only replies and the clock, never the ledger's internals.

type propKey struct {
	name string
	lim  ration.Limits
}

const numPropKeys = 3

var propKeys = [numPropKeys]propKey{
	{"k0", ration.Limits{RPM: 60, TPM: 600}},
	{"k1", ration.Limits{RPM: 30, TPM: 120, BurstTokens: 200}},
	{"k2", ration.Limits{RPM: 1200, TPM: 48_000, Window: time.Hour}}, // 20 a minute, with an hour's burst
}

const propTTL = 10 * time.Second

type admission struct {
	at  bucket.Instant
	key int
	amt ration.Amount
}

type pendingRes struct {
	key int
	amt ration.Amount
	at  bucket.Instant
}

type heldView struct {
	held ration.Amount
	exp  bucket.Instant
	// The share granted with the reply: the holding may grow by its
	// accrual (rounded up) from the reply, up to the burst.
	share ration.Share
	burst ration.Amount
	from  bucket.Instant
}

// limit is the most the holding can be at now by the reply's word: its held
// plus what the share may have added, and nothing once it expired.
func (v *heldView) limit(k int, now bucket.Instant) ration.Amount {
	if v.exp <= now {
		return ration.Amount{}
	}
	if v.share.Zero() {
		return v.held
	}
	acc := propKeys[k].lim.Accrued(v.share, now.Sub(v.from), true)
	grown := func(held, add, to int64) int64 {
		if held >= to {
			return held
		}
		return min(held+add, to)
	}
	return ration.Amount{Requests: grown(v.held.Requests, acc.Requests, v.burst.Requests), Tokens: grown(v.held.Tokens, acc.Tokens, v.burst.Tokens)}
}

// callKind is the method of a model spender's call.
type callKind uint8

const (
	kindAcquire callKind = iota + 1
	kindReserve
)

type lastCall struct {
	kind     callKind
	seq      uint64
	acquire  []AcquireKey
	reserve  []ReserveKey
	sent     bucket.Instant
	reply    any  // the reply the ledger gave (nil if the call failed)
	received bool // the spender got it
	restored bool // the allocator restarted since: a retry's snapshots are recomputed
}

type modelSpender struct {
	id      string
	liar    bool // never admits; over-claims returns and held
	epoch   uint64
	seq     uint64
	applied uint64 // the highest sequence the ledger applied in this epoch
	pool    [numPropKeys]ration.Amount
	exp     [numPropKeys]bucket.Instant
	share   [numPropKeys]shareView
	pending []pendingRes
	last    *lastCall
	// ledger-side view from replies, by epoch and key
	view map[uint64]*[numPropKeys]heldView
}

// shareView is a model spender's refill share on one key, applied by the
// spender's rules: accrual rounded down from receipt until the lease ends,
// none while a call carrying the key is in flight, never above the burst.
type shareView struct {
	share    ration.Share
	burst    ration.Amount
	from     bucket.Instant
	credited ration.Amount // accrual since from already added to the pool
	paused   bool          // a call carrying the key was sent and its reply not received
	// The fraction of a unit carried in from the previous share, and the
	// one left at the last accrual (carried into the next share).
	carried, left ration.Remainder
}

// renewed is the view of a share received at now, carrying v's fraction.
func (v *shareView) renewed(sh ration.Share, burst ration.Amount, now bucket.Instant) shareView {
	return shareView{share: sh, burst: burst, from: now, carried: v.left, left: v.left}
}

// accrue adds key k's share accrual up to now to its pool.
func (s *modelSpender) accrue(k int, now bucket.Instant) {
	s.share[k].accrue(propKeys[k].lim, &s.pool[k], s.exp[k], now)
}

// accrue adds the share's accrual up to min(now, exp) to pool, by the
// spender's rules.
func (v *shareView) accrue(lim ration.Limits, pool *ration.Amount, exp, now bucket.Instant) {
	if v.paused || v.share.Zero() {
		return
	}
	total, left := lim.AccruedCarry(v.share, min(now, exp).Sub(v.from), v.carried)
	v.left = left
	add := total.Sub(v.credited).Positive()
	v.credited = v.credited.Max(total)
	grow := func(pool *int64, add, burst int64) {
		if *pool < burst {
			*pool = min(*pool+add, burst)
		}
	}
	grow(&pool.Requests, add.Requests, v.burst.Requests)
	grow(&pool.Tokens, add.Tokens, v.burst.Tokens)
}

type propHarness struct {
	t        *rapid.T
	path     string
	clk      *fakeClock
	strict   bool
	l        *Ledger
	failNext atomic.Bool
	spenders []*modelSpender
	adm      []admission
	debt     [numPropKeys]ration.Amount

	// The ledger incarnation's command log, for the determinism check.
	start   []byte // the state at open
	applied []appliedCmd
}

// appliedCmd is one command the ledger applied, with what it gave.
type appliedCmd struct {
	cmd     ledger.Command
	reply   string // the reply or error, printed
	changed []byte // the records it changed, as a batch
}

func (h *propHarness) now() bucket.Instant { return ledger.InstantOf(h.clk.Now()) }

func (h *propHarness) open() {
	l, err := Open(h.path, WithClock(h.clk), WithTTL(propTTL), WithStrict(h.strict), withNoSync(),
		withHook(func(string) error {
			if h.failNext.Load() {
				return errors.New("injected crash")
			}
			return nil
		}),
		withApplied(func(cmd ledger.Command, reply any, changed []byte, err error) {
			h.applied = append(h.applied, appliedCmd{cmd: cmd, reply: fmt.Sprintf("%+v %v", reply, err), changed: changed})
		}))
	if err != nil {
		h.t.Fatal(err)
	}
	h.l = l
	h.start, h.applied = []byte(dump(l)), nil
	for _, s := range h.spenders {
		if s.last != nil {
			s.last.restored = true
		}
	}
}

// close closes the ledger (a crash or a restart: memory is lost, the disk
// has the last commit) after checking determinism: the incarnation's
// command log, replayed with the same instants into a fresh state restored
// from the state at open, gives the same replies, the same changed records
// and the same final state, byte for byte.
func (h *propHarness) close() {
	final := dump(h.l)
	cfg := h.l.state.Config()
	h.l.Close()
	st, err := ledger.Restore(cfg, h.start, 0)
	if err != nil {
		h.t.Fatalf("restore the state at open: %v", err)
	}
	for i, a := range h.applied {
		reply, changed, err := st.Apply(a.cmd)
		var batch []byte
		if err == nil && !changed.Empty() {
			batch = st.AppendRecords(nil, changed)
		}
		r := fmt.Sprintf("%+v %v", reply, err)
		c := batch
		if r != a.reply || !bytes.Equal(c, a.changed) {
			h.t.Fatalf("replayed command %d %+v: reply %s, changed %x; the ledger gave %s, %x", i, a.cmd, r, c, a.reply, a.changed)
		}
	}
	if string(st.Snapshot()) != final {
		h.t.Fatalf("replaying %d commands gave another state than the ledger's", len(h.applied))
	}
}

// sansSnapshots prints an Acquire or ReserveAhead reply without its
// snapshots, which a retry answered after a restart gets recomputed.
func sansSnapshots(r any) string {
	switch r := r.(type) {
	case *AcquireReply:
		c := *r
		c.Keys = slices.Clone(r.Keys)
		for i := range c.Keys {
			c.Keys[i].Snapshot = Snapshot{}
		}
		return fmt.Sprint(c)
	case *ReserveReply:
		c := *r
		c.Keys = slices.Clone(r.Keys)
		for i := range c.Keys {
			c.Keys[i].Snapshot = Snapshot{}
		}
		return fmt.Sprint(c)
	}
	return fmt.Sprint(r)
}

func (s *modelSpender) viewOf(epoch uint64) *[numPropKeys]heldView {
	v := s.view[epoch]
	if v == nil {
		v = new([numPropKeys]heldView)
		s.view[epoch] = v
	}
	return v
}

func (s *modelSpender) caller() Caller {
	return Caller{SpenderID: s.id, Epoch: s.epoch, Sequence: s.seq}
}

func (s *modelSpender) pendingOn(k int) (a ration.Amount) {
	for _, p := range s.pending {
		if p.key == k {
			a.Requests += p.amt.Requests
			a.Tokens += p.amt.Tokens
		}
	}
	return a
}

func amountGen(max int64) *rapid.Generator[ration.Amount] {
	return rapid.Custom(func(t *rapid.T) ration.Amount {
		return ration.Amount{Requests: rapid.Int64Range(0, max/10+1).Draw(t, "r"), Tokens: rapid.Int64Range(0, max).Draw(t, "t")}
	})
}

// advance moves the clock, admitting due reservations at their instants
// and dropping pools whose lease expired.
func (h *propHarness) advance(d time.Duration) {
	end := h.now().Add(d)
	for {
		next := end
		for _, s := range h.spenders {
			for _, p := range s.pending {
				if p.at < next {
					next = p.at
				}
			}
		}
		if next > h.now() {
			h.clk.Advance(next.Sub(h.now()))
		}
		for _, s := range h.spenders {
			kept := s.pending[:0]
			for _, p := range s.pending {
				if p.at <= h.now() {
					h.adm = append(h.adm, admission{at: h.now(), key: p.key, amt: p.amt})
				} else {
					kept = append(kept, p)
				}
			}
			s.pending = kept
			for k := range s.pool {
				s.accrue(k, h.now())
				if s.exp[k] <= h.now() {
					s.pool[k] = ration.Amount{}
				}
			}
		}
		if next == end {
			return
		}
	}
}

// checkReturn checks a credited return against the ledger's last word on
// the holding, then records the new holding.
func (h *propHarness) checkReturn(s *modelSpender, epoch uint64, k int, credited, held ration.Amount, exp bucket.Instant, sh ration.Share, burst ration.Amount) {
	v := &s.viewOf(epoch)[k]
	limit := v.limit(k, h.now())
	if credited.Requests > limit.Requests || credited.Tokens > limit.Tokens {
		h.t.Fatalf("spender %s key %d: credited return %+v exceeds holding %+v", s.id, k, credited, limit)
	}
	v.held = held
	v.exp = max(v.exp, exp)
	v.share, v.burst, v.from = sh, burst, h.now()
}

func (h *propHarness) acquire(t *rapid.T, s *modelSpender) {
	var keys []AcquireKey
	for k, pk := range propKeys {
		if !rapid.Bool().Draw(t, "include") {
			continue
		}
		ak := AcquireKey{Key: pk.name, Limits: pk.lim, Want: amountGen(400).Draw(t, "want")}
		if rapid.IntRange(0, 3).Draw(t, "needs") == 0 {
			ak.Need = amountGen(150).Draw(t, "need")
		}
		ak.SpendRate = amountGen(600).Draw(t, "rate")
		if rapid.IntRange(0, 2).Draw(t, "demands") > 0 {
			ak.Demand = amountGen(3000).Draw(t, "demand")
		}
		// The held report counts what the share added up to now, and the
		// share stops until the reply is received.
		s.accrue(k, h.now())
		s.share[k].paused = true
		if s.liar {
			ak.Returned = ration.Amount{Requests: s.pool[k].Requests + rapid.Int64Range(0, 50).Draw(t, "xr"), Tokens: s.pool[k].Tokens + rapid.Int64Range(0, 500).Draw(t, "xt")}
			ak.Held = amountGen(1000).Draw(t, "lie")
			s.pool[k] = ration.Amount{}
		} else {
			ret := ration.Amount{Requests: rapid.Int64Range(0, s.pool[k].Requests).Draw(t, "rr"), Tokens: rapid.Int64Range(0, s.pool[k].Tokens).Draw(t, "rt")}
			ak.Returned = ret
			s.pool[k].Requests -= ret.Requests
			s.pool[k].Tokens -= ret.Tokens
			p := s.pendingOn(k)
			ak.Held = ration.Amount{Requests: s.pool[k].Requests + p.Requests, Tokens: s.pool[k].Tokens + p.Tokens}
			if rapid.IntRange(0, 5).Draw(t, "overrun") == 0 {
				ak.Debt = amountGen(30).Draw(t, "debt")
				h.adm = append(h.adm, admission{at: h.now(), key: k, amt: ak.Debt})
				h.debt[k].Requests += ak.Debt.Requests
				h.debt[k].Tokens += ak.Debt.Tokens
			}
		}
		keys = append(keys, ak)
	}
	if len(keys) == 0 {
		return
	}
	s.seq += uint64(rapid.IntRange(1, 2).Draw(t, "seqstep"))
	s.last = &lastCall{kind: kindAcquire, seq: s.seq, acquire: keys, sent: h.now()}
	h.send(t, s)
}

func (h *propHarness) reserve(t *rapid.T, s *modelSpender) {
	if s.liar {
		return
	}
	k := rapid.IntRange(0, len(propKeys)-1).Draw(t, "rk")
	rk := ReserveKey{Key: propKeys[k].name, Limits: propKeys[k].lim, Cost: amountGen(150).Draw(t, "cost"),
		MaxWait: time.Duration(rapid.Int64Range(0, 20).Draw(t, "maxwait")) * time.Second}
	s.seq++
	s.last = &lastCall{kind: kindReserve, seq: s.seq, reserve: []ReserveKey{rk}, sent: h.now()}
	h.send(t, s)
}

// send delivers s.last to the ledger and decides the reply's fate.
func (h *propHarness) send(t *rapid.T, s *modelSpender) {
	c := s.last
	crash := rapid.IntRange(0, 12).Draw(t, "crash") == 0
	if crash {
		h.failNext.Store(true)
	}
	var reply any
	var err error
	call := Caller{SpenderID: s.id, Epoch: s.epoch, Sequence: c.seq}
	switch c.kind {
	case kindAcquire:
		reply, err = h.l.Acquire(ctx, call, c.acquire)
	case kindReserve:
		reply, err = h.l.ReserveAhead(ctx, call, c.reserve)
	}
	if crash {
		h.failNext.Store(false)
		// A retry of a call that is already durable needs no commit, so
		// the injected failure may not hit it.
		if err != nil {
			if !errors.Is(err, ErrNotDurable) {
				t.Fatalf("injected commit failure: %v", err)
			}
			h.close() // the crash: memory is lost, the disk has the last commit
			h.open()
			return
		}
	}
	if err != nil {
		t.Fatalf("call %+v: %v", call, err)
	}
	s.applied = c.seq
	if c.reply != nil {
		// A retry must get exactly the stored reply; after a restart, all of
		// it but the snapshots (informational, recomputed from the key).
		if fmt.Sprint(reply) != fmt.Sprint(c.reply) && (!c.restored || sansSnapshots(reply) != sansSnapshots(c.reply)) {
			t.Fatalf("retry reply %v, want stored %v", reply, c.reply)
		}
	} else {
		c.reply = reply
		h.observe(s, c)
	}
	if rapid.IntRange(0, 3).Draw(t, "drop") == 0 {
		return // reply lost
	}
	if !c.received {
		c.received = true
		h.deliver(s, c)
	}
}

// observe checks a fresh reply (whether or not the spender gets it).
func (h *propHarness) observe(s *modelSpender, c *lastCall) {
	switch r := c.reply.(type) {
	case *AcquireReply:
		for i, ak := range c.acquire {
			k := keyIndex(ak.Key)
			g := r.Keys[i]
			if g.Granted.Requests > max(ak.Want.Requests, ak.Need.Requests) || g.Granted.Tokens > max(ak.Want.Tokens, ak.Need.Tokens) {
				h.t.Fatalf("granted %+v beyond want %+v / need %+v", g.Granted, ak.Want, ak.Need)
			}
			if g.Status == StatusOK && (g.Granted.Requests < ak.Need.Requests || g.Granted.Tokens < ak.Need.Tokens) {
				h.t.Fatalf("granted %+v below need %+v", g.Granted, ak.Need)
			}
			h.checkReturn(s, s.epoch, k, g.Returned, g.Held, h.now().Add(propTTL), g.Share, g.ShareBurst)
		}
	case *ReserveReply:
		for i, rk := range c.reserve {
			k := keyIndex(rk.Key)
			g := r.Keys[i]
			exp := h.now()
			// A reservation keeps the share; its cost is held on top of
			// what the share may grow to.
			v := s.viewOf(s.epoch)[k]
			sh, burst := v.share, v.burst
			if v.exp <= h.now() {
				sh, burst = ration.Share{}, ration.Amount{}
			}
			if g.Status == StatusOK {
				exp = h.now().Add(g.Wait + propTTL)
				if burst.Requests > 0 {
					burst.Requests += rk.Cost.Requests
				}
				if burst.Tokens > 0 {
					burst.Tokens += rk.Cost.Tokens
				}
			}
			h.checkReturn(s, s.epoch, k, ration.Amount{}, g.Held, exp, sh, burst)
		}
	}
}

func keyIndex(name string) int {
	for i, pk := range propKeys {
		if pk.name == name {
			return i
		}
	}
	panic(name)
}

// deliver hands a reply to the model spender.
func (h *propHarness) deliver(s *modelSpender, c *lastCall) {
	switch r := c.reply.(type) {
	case *AcquireReply:
		for i, ak := range c.acquire {
			k := keyIndex(ak.Key)
			if s.exp[k] <= h.now() {
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
			s.share[k] = s.share[k].renewed(r.Keys[i].Share, r.Keys[i].ShareBurst, h.now())
		}
	case *ReserveReply:
		for i, rk := range c.reserve {
			// Send no earlier than receipt + wait (receipt is now), and only
			// while the reservation is usable: until first send + wait +
			// TTL (the protocol). A reply that arrives after that (a retry
			// answered late from the record) is not used.
			if r.Keys[i].Status == StatusOK && h.now() < c.sent.Add(r.LeaseTTL) {
				s.pending = append(s.pending, pendingRes{key: keyIndex(rk.Key), amt: rk.Cost, at: h.now().Add(r.Keys[i].Wait)})
			}
		}
	}
}

func (h *propHarness) consume(t *rapid.T) {
	s := h.spenders[rapid.IntRange(0, len(h.spenders)-1).Draw(t, "who")]
	if s.liar {
		return
	}
	k := rapid.IntRange(0, len(propKeys)-1).Draw(t, "ck")
	if s.exp[k] <= h.now() {
		return
	}
	s.accrue(k, h.now())
	a := ration.Amount{Requests: rapid.Int64Range(0, s.pool[k].Requests).Draw(t, "cr"), Tokens: rapid.Int64Range(0, s.pool[k].Tokens).Draw(t, "ct")}
	s.pool[k].Requests -= a.Requests
	s.pool[k].Tokens -= a.Tokens
	h.adm = append(h.adm, admission{at: h.now(), key: k, amt: a})
}

func (h *propHarness) release(t *rapid.T, s *modelSpender) {
	// Each key listed (its pool given back) or not (released with nothing
	// credited: the spender just drops it).
	var keys []ReleaseKey
	var listed []int
	for k, pk := range propKeys {
		if !rapid.Bool().Draw(t, "listed") {
			continue
		}
		ret := s.pool[k]
		if s.liar {
			ret.Tokens += 100
		}
		keys = append(keys, ReleaseKey{Key: pk.name, Limits: pk.lim, Returned: ret})
		listed = append(listed, k)
	}
	s.seq++
	r, err := h.l.Release(ctx, s.caller(), keys)
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	for i, k := range listed {
		h.checkReturn(s, s.epoch, k, r.Returned[i], ration.Amount{}, 0, ration.Share{}, ration.Amount{})
	}
	for k := range propKeys {
		s.viewOf(s.epoch)[k] = heldView{}
	}
	h.newEpoch(s)
}

func (h *propHarness) newEpoch(s *modelSpender) {
	s.epoch++
	s.seq, s.applied = 0, 0
	s.pool = [numPropKeys]ration.Amount{}
	s.share = [numPropKeys]shareView{}
	s.pending = nil
	s.last = nil
}

// check verifies the bound for every key, dimension and window ending now.
func (h *propHarness) check() {
	now := h.now()
	for k, pk := range propKeys {
		for d := 0; d < 2; d++ {
			lim, on := pk.lim.RequestLimit()
			pick := func(a ration.Amount) int64 { return a.Requests }
			if d == 1 {
				lim, on = pk.lim.TokenLimit()
				pick = func(a ration.Amount) int64 { return a.Tokens }
			}
			if !on {
				continue
			}
			var usable int64
			for _, s := range h.spenders {
				if s.exp[k] > now {
					usable += pick(s.pool[k])
				}
			}
			pus := int64(lim.Period / time.Microsecond)
			extra := int64(propTTL / time.Microsecond)
			if h.strict {
				extra = 0
			}
			debt := pick(h.debt[k])
			starts := []bucket.Instant{now}
			for _, a := range h.adm {
				starts = append(starts, a.at)
			}
			for _, a0 := range starts {
				var admitted int64
				for _, a := range h.adm {
					if a.key == k && a.at >= a0 {
						admitted += pick(a.amt)
					}
				}
				lhs := (admitted + usable) * pus
				rhs := (lim.Capacity+debt)*pus + lim.Refill*(int64(now-a0)+extra)
				if lhs > rhs {
					h.t.Fatalf("bound broken on key %s dim %d: window [%d, %d] admitted %d + usable %d > C %d + rho*(t%s) + debt %d (strict=%v)",
						pk.name, d, a0, now, admitted, usable, lim.Capacity, map[bool]string{false: "+TTL", true: ""}[h.strict], debt, h.strict)
				}
			}
		}
	}
}

func TestPropertyBoundAndReturns(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := &propHarness{t: t, path: tempDBRapid(t), clk: newFakeClock(), strict: rapid.Bool().Draw(t, "strict")}
		h.open()
		defer func() { h.close() }()
		for i := 0; i < 3; i++ {
			h.spenders = append(h.spenders, &modelSpender{
				id: fmt.Sprintf("s%d", i), liar: i == 2 && rapid.Bool().Draw(t, "liar"), epoch: 1,
				view: map[uint64]*[numPropKeys]heldView{},
			})
		}
		pick := func(t *rapid.T) *modelSpender {
			return h.spenders[rapid.IntRange(0, len(h.spenders)-1).Draw(t, "who")]
		}
		t.Repeat(map[string]func(*rapid.T){
			"advance": func(t *rapid.T) {
				h.advance(time.Duration(rapid.Int64Range(0, 15_000).Draw(t, "ms")) * time.Millisecond)
			},
			"acquire": func(t *rapid.T) { h.acquire(t, pick(t)) },
			"reserve": func(t *rapid.T) { h.reserve(t, pick(t)) },
			"consume": func(t *rapid.T) { h.consume(t) },
			"retry": func(t *rapid.T) {
				s := pick(t)
				if s.last != nil && !s.last.received {
					h.send(t, s)
				}
			},
			"stale": func(t *rapid.T) {
				s := pick(t)
				if s.applied < 2 {
					return
				}
				before := dump(h.l)
				_, err := h.l.Acquire(ctx, Caller{SpenderID: s.id, Epoch: s.epoch, Sequence: s.applied - 1},
					[]AcquireKey{{Key: "k0", Limits: propKeys[0].lim, Want: ration.Amount{Requests: 1, Tokens: 1}}})
				if !errors.Is(err, ErrStaleSequence) {
					t.Fatalf("reordered old call: %v, want stale sequence", err)
				}
				if dump(h.l) != before {
					t.Fatal("stale call changed the ledger")
				}
			},
			"release":         func(t *rapid.T) { h.release(t, pick(t)) },
			"spender restart": func(t *rapid.T) { h.newEpoch(pick(t)) },
			"allocator restart": func(t *rapid.T) {
				before := dump(h.l)
				h.close()
				h.open()
				if dump(h.l) != before {
					t.Fatal("restart did not resume exactly")
				}
			},
			"allocator loses a key": func(t *rapid.T) {
				// A restart that finds one key's record corrupt: the key
				// starts empty, with no holdings (invariant 5), while the
				// spenders keep their pools and shares until their next
				// call cuts them to the reply's held.
				k := propKeys[rapid.IntRange(0, len(propKeys)-1).Draw(t, "lost")].name
				h.close()
				h.open()
				h.close() // the open replayed the journal into the keys bucket
				db, err := bolt.Open(h.path, 0o600, nil)
				if err != nil {
					t.Fatal(err)
				}
				err = db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketKeys).Put([]byte(k), []byte{2, 0, 0xff}) })
				db.Close()
				if err != nil {
					t.Fatal(err)
				}
				h.open()
			},
			"sweep": func(t *rapid.T) {
				if _, _, err := h.l.Sweep(ctx); err != nil {
					t.Fatal(err)
				}
			},
			"": func(t *rapid.T) { h.check() },
		})
	})
}

// tempDBRapid returns a fresh store path for one rapid run.
func tempDBRapid(t *rapid.T) string {
	dir, err := osMkdirTemp()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { osRemoveAll(dir) })
	return dir + "/ledger.db"
}
