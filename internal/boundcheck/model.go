package boundcheck

import (
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/bucket"
	"github.com/rationhq/ration/internal/fakeclock"
)

// T is where a model draws its choices and reports failures. Each draw
// names what it draws (label), for a test framework that prints them.
type T interface {
	// IntRange returns an int in [lo, hi].
	IntRange(lo, hi int, label string) int
	// Int64Range returns an int64 in [lo, hi].
	Int64Range(lo, hi int64, label string) int64
	// Bool returns true or false.
	Bool(label string) bool
	// Amount returns requests in [0, max/10+1] and tokens in [0, max].
	Amount(max int64, label string) ration.Amount
	// Fatalf reports a failure and stops the test.
	Fatalf(format string, args ...any)
}

// Ledger carries the model spenders' calls to the ledger under test.
type Ledger interface {
	// Send applies spender s's call c (an Acquire or a ReserveAhead, sent
	// again if it was sent before) with caller c.Caller, and returns the
	// reply the ledger gave. applied is false when the call failed without
	// being applied, as a crash before its commit does: the spender gets
	// nothing and may retry. Any other error fails the test.
	Send(s *Spender, c *Call) (reply any, applied bool)
	// Release applies a Release and returns its reply; an error fails the
	// test.
	Release(c ledger.Caller, keys []ledger.ReleaseKey) *ledger.ReleaseReply
}

// Model is a set of model spenders calling one ledger, with what they
// admitted and the debt they reported, on a manual clock.
type Model struct {
	t        T
	clk      *fakeclock.Clock
	strict   bool
	ledger   Ledger
	keys     [NumKeys]Key
	spenders []*Spender
	adm      []admission
	debt     [NumKeys]ration.Amount
}

// New returns a model with no spenders on clock clk (which the model
// advances), checking the strict bound if strict, whose calls go to l.
func New(t T, clk *fakeclock.Clock, strict bool, l Ledger) *Model {
	return &Model{t: t, clk: clk, strict: strict, ledger: l, keys: Keys()}
}

// AddSpender adds a spender with id id in epoch 1. A liar never admits,
// over-claims its returns and reports random holdings.
func (m *Model) AddSpender(id string, liar bool) *Spender {
	s := &Spender{id: id, liar: liar, epoch: 1, view: map[uint64]*[NumKeys]heldView{}}
	m.spenders = append(m.spenders, s)
	return s
}

// Spenders returns the model's spenders, in the order added.
func (m *Model) Spenders() []*Spender { return m.spenders }

// Now returns the clock's instant.
func (m *Model) Now() bucket.Instant { return ledger.InstantOf(m.clk.Now()) }

// Restarted tells the model that the ledger may have lost its stored
// replies' snapshots (it restored its state from a record): a retry of a
// call sent before may get its snapshots recomputed.
func (m *Model) Restarted() {
	for _, s := range m.spenders {
		if s.last != nil {
			s.last.restored = true
		}
	}
}

// admission is an admitted amount on key at an instant.
type admission struct {
	at  bucket.Instant
	key int
	amt ration.Amount
}

// pendingRes is a reservation made ahead, to be admitted at at.
type pendingRes struct {
	key int
	amt ration.Amount
	at  bucket.Instant
}

// callKind is the method of a model spender's call.
type callKind uint8

const (
	kindAcquire callKind = iota + 1
	kindReserve
)

// Call is a model spender's latest Acquire or ReserveAhead, kept to be
// sent again until its reply is received.
type Call struct {
	Caller  ledger.Caller
	Acquire []ledger.AcquireKey // the keys of an Acquire, or nil
	Reserve []ledger.ReserveKey // the keys of a ReserveAhead, or nil

	kind     callKind
	sent     bucket.Instant
	reply    any  // the reply the ledger gave (nil before the first)
	received bool // the spender got it
	restored bool // the ledger restarted since: a retry's snapshots are recomputed
}

// Command returns the call as a ledger command stamped with now.
func (c *Call) Command(now bucket.Instant) ledger.Command {
	if c.kind == kindReserve {
		return ledger.ReserveAhead{Now: now, Caller: c.Caller, Keys: c.Reserve}
	}
	return ledger.Acquire{Now: now, Caller: c.Caller, Keys: c.Acquire}
}

// Answered reports whether the ledger has answered the call (whether or
// not the spender got the reply).
func (c *Call) Answered() bool { return c.reply != nil }

// Restored reports whether the model was told (Restarted) that the ledger
// may have restored its state since the call was made: a retry's reply is
// then compared without its snapshots.
func (c *Call) Restored() bool { return c.restored }

// Spender is a model spender: its pools, leases and shares per key, what
// it reserved ahead, its latest call, and what the ledger's replies said
// it holds, per epoch and key.
type Spender struct {
	id      string
	liar    bool // never admits; over-claims returns and held
	epoch   uint64
	seq     uint64
	applied uint64 // the highest sequence the ledger applied in this epoch
	pool    [NumKeys]ration.Amount
	exp     [NumKeys]bucket.Instant
	share   [NumKeys]ShareView
	pending []pendingRes
	last    *Call
	view    map[uint64]*[NumKeys]heldView // the ledger's word, by epoch and key
}

// ID returns the spender's id.
func (s *Spender) ID() string { return s.id }

// Epoch returns the spender's current epoch.
func (s *Spender) Epoch() uint64 { return s.epoch }

// Applied returns the highest sequence the ledger answered in the current
// epoch (0: none).
func (s *Spender) Applied() uint64 { return s.applied }

// Last returns the spender's latest Acquire or ReserveAhead in this
// epoch, or nil.
func (s *Spender) Last() *Call { return s.last }

// Waiting reports whether the spender has a call whose reply it has not
// received.
func (s *Spender) Waiting() bool { return s.last != nil && !s.last.received }

func (s *Spender) viewOf(epoch uint64) *[NumKeys]heldView {
	v := s.view[epoch]
	if v == nil {
		v = new([NumKeys]heldView)
		s.view[epoch] = v
	}
	return v
}

func (s *Spender) caller() ledger.Caller {
	return ledger.Caller{SpenderID: s.id, Epoch: s.epoch, Sequence: s.seq}
}

func (s *Spender) pendingOn(k int) (a ration.Amount) {
	for _, p := range s.pending {
		if p.key == k {
			a.Requests += p.amt.Requests
			a.Tokens += p.amt.Tokens
		}
	}
	return a
}

// accrue adds key k's share accrual up to now to its pool.
func (m *Model) accrue(s *Spender, k int, now bucket.Instant) {
	s.share[k].Accrue(m.keys[k].Limits, &s.pool[k], s.exp[k], now)
}

// Advance moves the clock by d, admitting due reservations at their
// instants, accruing shares and dropping pools whose lease expired.
func (m *Model) Advance(d time.Duration) {
	end := m.Now().Add(d)
	for {
		next := end
		for _, s := range m.spenders {
			for _, p := range s.pending {
				if p.at < next {
					next = p.at
				}
			}
		}
		if next > m.Now() {
			m.clk.Advance(next.Sub(m.Now()))
		}
		for _, s := range m.spenders {
			kept := s.pending[:0]
			for _, p := range s.pending {
				if p.at <= m.Now() {
					m.adm = append(m.adm, admission{at: m.Now(), key: p.key, amt: p.amt})
				} else {
					kept = append(kept, p)
				}
			}
			s.pending = kept
			for k := range s.pool {
				m.accrue(s, k, m.Now())
				if s.exp[k] <= m.Now() {
					s.pool[k] = ration.Amount{}
				}
			}
		}
		if next == end {
			return
		}
	}
}

// NewEpoch restarts spender s: a new epoch, with nothing held, no share,
// nothing reserved and no call to retry.
func (m *Model) NewEpoch(s *Spender) {
	s.epoch++
	s.seq, s.applied = 0, 0
	s.pool = [NumKeys]ration.Amount{}
	s.share = [NumKeys]ShareView{}
	s.pending = nil
	s.last = nil
}
