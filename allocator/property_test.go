package allocator

import (
	"bytes"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/internal/boundcheck"
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
// The model spenders call with the credential "h" (the network's auth
// would stamp it). A hostile caller with the credential "x" sends, beside
// them, debts, demands, spend rates, returns and holdings up to 2^50 and
// releases; it takes no grant and admits nothing, so the bound must hold
// with only the model spenders' debt; and its calls under a model
// spender's id are refused and change nothing.
//
// The model spenders and the checks are package boundcheck's (the cluster's
// property test uses them too); this file is the ledger they call. The
// model spenders only use what replies they received told them; the
// checks use only replies and the clock, never the ledger's internals.

// rapidT draws a model's choices from a rapid.T.
type rapidT struct{ *rapid.T }

func (t rapidT) IntRange(lo, hi int, label string) int {
	return rapid.IntRange(lo, hi).Draw(t.T, label)
}
func (t rapidT) Int64Range(lo, hi int64, label string) int64 {
	return rapid.Int64Range(lo, hi).Draw(t.T, label)
}
func (t rapidT) Bool(label string) bool { return rapid.Bool().Draw(t.T, label) }
func (t rapidT) Amount(max int64, label string) ration.Amount {
	return amountGen(max).Draw(t.T, label)
}

func amountGen(max int64) *rapid.Generator[ration.Amount] {
	return rapid.Custom(func(t *rapid.T) ration.Amount {
		return ration.Amount{Requests: rapid.Int64Range(0, max/10+1).Draw(t, "r"), Tokens: rapid.Int64Range(0, max).Draw(t, "t")}
	})
}

// propHarness is the boundcheck.Ledger of the property test: a durable
// Ledger whose commits can fail like a crash, restarted in between.
type propHarness struct {
	t        *rapid.T
	path     string
	clk      *fakeClock
	strict   bool
	l        *Ledger
	failNext atomic.Bool
	m        *boundcheck.Model

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

func (h *propHarness) open() {
	l, err := Open(h.path, WithClock(h.clk), WithTTL(boundcheck.TTL), WithStrict(h.strict), withNoSync(),
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
	if h.m != nil {
		h.m.Restarted()
	}
}

// close closes the ledger (a crash or a restart: memory is lost, the disk
// has the last commit) after checking determinism: the incarnation's
// command log, replayed with the same instants into a fresh state restored
// from the state at open, gives the same replies, the same changed records
// and the same final state, byte for byte.
func (h *propHarness) close() {
	final := dump(h.l)
	cfg := memoryOf(h.l).state.Config()
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

// Send delivers a model spender's call to the ledger; one in thirteen
// commits fails like a crash, and the ledger restarts.
func (h *propHarness) Send(s *boundcheck.Spender, c *boundcheck.Call) (any, bool) {
	t := h.t
	crash := rapid.IntRange(0, 12).Draw(t, "crash") == 0
	if crash {
		h.failNext.Store(true)
	}
	var reply any
	var err error
	c.Caller.Credential = "h"
	if c.Acquire != nil {
		reply, err = h.l.Acquire(ctx, c.Caller, c.Acquire)
	} else {
		reply, err = h.l.ReserveAhead(ctx, c.Caller, c.Reserve)
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
			return nil, false
		}
	}
	if err != nil {
		t.Fatalf("call %+v: %v", c.Caller, err)
	}
	return reply, true
}

// Release releases a model spender's epoch.
func (h *propHarness) Release(c ledger.Caller, keys []ledger.ReleaseKey) *ledger.ReleaseReply {
	c.Credential = "h"
	r, err := h.l.Release(ctx, c, keys)
	if err != nil {
		h.t.Fatalf("release: %v", err)
	}
	return r
}

func TestPropertyBoundAndReturns(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := &propHarness{t: t, path: tempDBRapid(t), clk: newFakeClock(), strict: rapid.Bool().Draw(t, "strict")}
		h.open()
		defer func() { h.close() }()
		h.m = boundcheck.New(rapidT{t}, h.clk, h.strict, h)
		for i := 0; i < 3; i++ {
			h.m.AddSpender(fmt.Sprintf("s%d", i), i == 2 && rapid.Bool().Draw(t, "liar"))
		}
		pick := func(t *rapid.T) *boundcheck.Spender {
			sp := h.m.Spenders()
			return sp[rapid.IntRange(0, len(sp)-1).Draw(t, "who")]
		}
		hostile := ledger.Caller{SpenderID: "x", Epoch: 1, Credential: "x"}
		wild := func(t *rapid.T, label string) ration.Amount {
			pick := func() int64 {
				return rapid.OneOf(rapid.Int64Range(0, 100), rapid.Just(int64(ration.MaxAmount))).Draw(t, label)
			}
			return ration.Amount{Requests: pick(), Tokens: pick()}
		}
		t.Repeat(map[string]func(*rapid.T){
			"advance": func(t *rapid.T) {
				h.m.Advance(time.Duration(rapid.Int64Range(0, 15_000).Draw(t, "ms")) * time.Millisecond)
			},
			"acquire": func(t *rapid.T) { h.m.Acquire(pick(t)) },
			"reserve": func(t *rapid.T) { h.m.Reserve(pick(t)) },
			"consume": func(t *rapid.T) { h.m.Consume() },
			"retry":   func(t *rapid.T) { h.m.Retry(pick(t)) },
			"stale": func(t *rapid.T) {
				s := pick(t)
				if s.Applied() < 2 {
					return
				}
				before := dump(h.l)
				k0 := boundcheck.Keys()[0]
				_, err := h.l.Acquire(ctx, ledger.Caller{SpenderID: s.ID(), Epoch: s.Epoch(), Sequence: s.Applied() - 1, Credential: "h"},
					[]ledger.AcquireKey{{Key: k0.Name, Limits: k0.Limits, Want: ration.Amount{Requests: 1, Tokens: 1}}})
				if !errors.Is(err, ledger.ErrStaleSequence) {
					t.Fatalf("reordered old call: %v, want stale sequence", err)
				}
				if dump(h.l) != before {
					t.Fatal("stale call changed the ledger")
				}
			},
			"hostile": func(t *rapid.T) {
				var keys []ledger.AcquireKey
				for _, k := range boundcheck.Keys() {
					if rapid.Bool().Draw(t, "include") {
						keys = append(keys, ledger.AcquireKey{Key: k.Name, Limits: k.Limits, SpendRate: wild(t, "rate"), Returned: wild(t, "returned"),
							Held: wild(t, "held"), Debt: wild(t, "debt"), Demand: wild(t, "demand")})
					}
				}
				if len(keys) == 0 {
					return
				}
				hostile.Sequence++
				if _, err := h.l.Acquire(ctx, hostile, keys); err != nil {
					t.Fatalf("hostile acquire: %v", err)
				}
			},
			"hostile release": func(t *rapid.T) {
				k := boundcheck.Keys()[rapid.IntRange(0, boundcheck.NumKeys-1).Draw(t, "key")]
				hostile.Sequence++
				if _, err := h.l.Release(ctx, hostile, []ledger.ReleaseKey{{Key: k.Name, Limits: k.Limits, Returned: wild(t, "returned"), Debt: wild(t, "debt")}}); err != nil {
					t.Fatalf("hostile release: %v", err)
				}
				hostile.Epoch, hostile.Sequence = hostile.Epoch+1, 0
			},
			"hostile under a spender's id": func(t *rapid.T) {
				s := pick(t)
				if s.Applied() == 0 {
					return // no session yet: squatting a spender id is first come, first served (docs/bound.md)
				}
				k := boundcheck.Keys()[0]
				before := dump(h.l)
				_, err := h.l.Acquire(ctx, ledger.Caller{SpenderID: s.ID(), Epoch: s.Epoch() + uint64(rapid.IntRange(0, 1).Draw(t, "next")), Sequence: s.Applied() + 1, Credential: "x"},
					[]ledger.AcquireKey{{Key: k.Name, Limits: k.Limits, Debt: wild(t, "debt")}})
				if !errors.Is(err, ledger.ErrForeignSpender) {
					t.Fatalf("a call under %s's id with another credential: %v", s.ID(), err)
				}
				if dump(h.l) != before {
					t.Fatal("a refused call under another's id changed the ledger")
				}
			},
			"release":         func(t *rapid.T) { h.m.Release(pick(t)) },
			"spender restart": func(t *rapid.T) { h.m.NewEpoch(pick(t)) },
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
				k := boundcheck.Keys()[rapid.IntRange(0, boundcheck.NumKeys-1).Draw(t, "lost")].Name
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
			"": func(t *rapid.T) { h.m.Check() },
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
