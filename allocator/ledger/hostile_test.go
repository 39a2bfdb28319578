package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// TestPropertyHonestBesideHostile: an honest spender (credential "h")
// renews its lease on a key with a demand of at most half the key's rate,
// spending what it holds, while a hostile caller (credential "x", under
// several spender ids) sends whatever the protocol lets it: debts, demands,
// spend rates, returns and holdings up to 2^50, epochs up to twice the
// bound, calls under the honest spender's id, Releases with debts,
// reservations. After every step:
//
//   - nothing is minted: each dimension's level plus every holding's
//     potential is within the level cap (docs/bound.md), and no credited
//     return exceeds the holding the caller's previous answer named;
//   - what the rules refuse changes nothing: a call under the honest id is
//     ErrForeignSpender, an epoch beyond the bound an InputError, and the
//     state is byte for byte what it was;
//   - the honest spender is not starved: each renewal gets a refill share of
//     at least its demand's part of the rate.
//
// Hoarding (taking grants and holding them to the level cap) is not drawn:
// want and need stay 0. It is what a saturated gateway does and the rules
// here do not bound it (docs/bound.md, "What a caller can still do").
func TestPropertyHonestBesideHostile(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rpm := rapid.SampledFrom([]int64{60, 600, 6000}).Draw(t, "rpm")
		tpm := rapid.SampledFrom([]int64{0, 10_000, 1_000_000}).Draw(t, "tpm")
		lim := ration.Limits{RPM: rpm, TPM: tpm}
		st, err := New(Config{TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		now := t0
		demand := ration.Amount{Requests: rapid.Int64Range(1, rpm/2).Draw(t, "honest demand")}
		if tpm > 0 {
			demand.Tokens = rapid.Int64Range(1, tpm/2).Draw(t, "honest token demand")
		}
		honest := Caller{SpenderID: "honest", Epoch: 1, Credential: "h"}
		hostiles := []Caller{{SpenderID: "x0", Epoch: 1, Credential: "x"}, {SpenderID: "x1", Epoch: 1, Credential: "x"}}
		heldBy := map[string]ration.Amount{} // what each caller's last answer said it held
		renew := func() {
			honest.Sequence++
			// It has spent what it held, and wants one request's worth.
			r, _, err := st.Apply(Acquire{Now: now, Caller: honest, Keys: []AcquireKey{{Key: "k", Limits: lim, Demand: demand,
				SpendRate: demand, Want: ration.Amount{Requests: 1, Tokens: 100}}}})
			if err != nil {
				t.Fatalf("honest renewal: %v", err)
			}
			g := r.(*AcquireReply).Keys[0]
			want := ration.Share{Requests: demandShare(demand.Requests, bucket.PerMinute(rpm)) - 1}
			if tpm > 0 {
				want.Tokens = demandShare(demand.Tokens, bucket.PerMinute(tpm)) - 1
			}
			if g.Share.Requests < want.Requests || g.Share.Tokens < want.Tokens {
				t.Fatalf("honest renewal with demand %+v got share %+v (fair %+v), want at least %+v", demand, g.Share, g.ShareFair, want)
			}
			heldBy[honest.SpenderID] = g.Held
		}
		renew()
		amount := func(label string) ration.Amount {
			pick := func() int64 {
				return rapid.OneOf(rapid.Just(int64(0)), rapid.Int64Range(0, 100), rapid.Just(int64(ration.MaxAmount))).Draw(t, label)
			}
			return ration.Amount{Requests: pick(), Tokens: pick()}
		}
		check := func(what string) {
			ks := st.keys["k"]
			if ks == nil {
				return
			}
			pot := ks.potential()
			for _, d := range []struct {
				d    *dim
				held int64
			}{{&ks.req, pot.Requests}, {&ks.tok, pot.Tokens}} {
				if !d.d.on {
					continue
				}
				level, scale := d.d.b.Level()
				if level+d.held*scale > capUnits(&d.d.b, st.cfg.TTL, st.cfg.Strict) {
					t.Fatalf("after %s level %d + potential %d above the cap", what, level, d.held)
				}
			}
		}
		refused := func(cmd Command, want error) {
			before := st.Snapshot()
			if _, _, err := st.Apply(cmd); !errors.Is(err, want) {
				t.Fatalf("%+v: %v, want %v", cmd, err, want)
			}
			if !bytes.Equal(before, st.Snapshot()) {
				t.Fatalf("refused %+v changed the state", cmd)
			}
		}
		t.Repeat(map[string]func(*rapid.T){
			"advance": func(t *rapid.T) {
				now = now.Add(time.Duration(rapid.Int64Range(0, 2500).Draw(t, "ms")) * time.Millisecond)
			},
			"honest renews": func(t *rapid.T) { renew() },
			"hostile acquires": func(t *rapid.T) {
				i := rapid.IntRange(0, len(hostiles)-1).Draw(t, "who")
				c := &hostiles[i]
				c.Sequence++
				k := AcquireKey{Key: "k", Limits: lim, SpendRate: amount("rate"), Returned: amount("returned"), Held: amount("held"),
					Debt: amount("debt"), Demand: amount("demand")}
				r, _, err := st.Apply(Acquire{Now: now, Caller: *c, Keys: []AcquireKey{k}})
				if err != nil {
					t.Fatalf("hostile acquire: %v", err)
				}
				g := r.(*AcquireReply).Keys[0]
				if prev := heldBy[c.SpenderID]; g.Returned.Requests > max(prev.Requests, 0)+rpm || g.Returned.Tokens > prev.Tokens+tpm {
					// Accrual of a share may add up to a window's rate between calls.
					t.Fatalf("hostile credited %+v, held %+v", g.Returned, prev)
				}
				heldBy[c.SpenderID] = g.Held
				check("a hostile Acquire")
			},
			"hostile reserves": func(t *rapid.T) {
				c := &hostiles[rapid.IntRange(0, len(hostiles)-1).Draw(t, "who")]
				c.Sequence++
				cost := ration.Amount{Requests: rapid.Int64Range(0, 2).Draw(t, "cr"), Tokens: rapid.Int64Range(0, 100).Draw(t, "ct")}
				if _, _, err := st.Apply(ReserveAhead{Now: now, Caller: *c, Keys: []ReserveKey{{Key: "k", Limits: lim, Cost: cost}}}); err != nil {
					t.Fatalf("hostile reserve: %v", err)
				}
				check("a hostile ReserveAhead")
			},
			"hostile releases": func(t *rapid.T) {
				c := &hostiles[rapid.IntRange(0, len(hostiles)-1).Draw(t, "who")]
				c.Sequence++
				if _, _, err := st.Apply(Release{Now: now, Caller: *c, Keys: []ReleaseKey{{Key: "k", Limits: lim, Returned: amount("returned"), Debt: amount("debt")}}}); err != nil {
					t.Fatalf("hostile release: %v", err)
				}
				c.Epoch++
				c.Sequence = 0
				delete(heldBy, c.SpenderID)
				check("a hostile Release")
			},
			"hostile epoch": func(t *rapid.T) {
				c := &hostiles[rapid.IntRange(0, len(hostiles)-1).Draw(t, "who")]
				e := rapid.Uint64Range(c.Epoch+1, math.MaxUint64).Draw(t, "epoch")
				cmd := Acquire{Now: now, Caller: Caller{SpenderID: c.SpenderID, Epoch: e, Sequence: 1, Credential: "x"}, Keys: []AcquireKey{{Key: "k", Limits: lim}}}
				if e > maxEpoch(now) {
					refused(cmd, ErrInvalidArgument)
					return
				}
				if _, _, err := st.Apply(cmd); err != nil {
					t.Fatalf("hostile epoch %d: %v", e, err)
				}
				c.Epoch, c.Sequence = e, 1
				delete(heldBy, c.SpenderID)
			},
			"hostile under the honest id": func(t *rapid.T) {
				c := Caller{SpenderID: honest.SpenderID, Epoch: rapid.Uint64Range(1, maxEpoch(now)).Draw(t, "epoch"),
					Sequence: rapid.Uint64Range(1, math.MaxUint64).Draw(t, "seq"), Credential: "x"}
				refused(Acquire{Now: now, Caller: c, Keys: []AcquireKey{{Key: "k", Limits: lim, Debt: amount("debt")}}}, ErrForeignSpender)
				refused(Release{Now: now, Caller: c}, ErrForeignSpender)
			},
			"": func(t *rapid.T) {
				if honest.Sequence > 0 && now.Sub(lastRenewal(st, honest)) > 4*time.Second {
					renew() // the honest spender renews about every TTL/2
				}
				check(fmt.Sprintf("step at %v", now))
			},
		})
	})
}

// lastRenewal is when c's holding on key k was last refreshed (its expiry
// less the TTL), or the zero instant.
func lastRenewal(st *State, c Caller) bucket.Instant {
	ks := st.keys["k"]
	if ks == nil {
		return 0
	}
	if i := ks.find(c.SpenderID, c.Epoch); i >= 0 {
		return ks.holds[i].expiry.Add(-st.cfg.TTL)
	}
	return 0
}
