package spender

import (
	"math/rand/v2"
	"testing"
)

// TestKeyTableMatchesMap drives a keyTable and a Go map with the same
// random sets, lookups and rebuilds. Hashes are drawn so that many share
// their top bits (the slot index) and probe sequences run into each other
// and wrap around the end of the array.
func TestKeyTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		var tab keyTable
		model := map[uint64]*keyState{}
		hash := func() uint64 {
			top := rng.Uint64N(4) << 62 // few distinct top bits: long probes
			if round%2 == 0 {
				top = rng.Uint64() &^ (1<<40 - 1)
			}
			return top | rng.Uint64N(1<<12)
		}
		for op := range 3000 {
			switch r := rng.IntN(10); {
			case r < 5:
				h := hash()
				st := &keyState{key: "k"}
				tab.set(h, st)
				model[h] = st
			case r < 9:
				h := hash()
				if got, want := tab.get(h), model[h]; got != want {
					t.Fatalf("round %d op %d: get(%#x) = %p, want %p", round, op, h, got, want)
				}
			default:
				// A sweep: keep about half, rebuild.
				var kept []tableSlot
				for h, st := range model {
					if rng.IntN(2) == 0 {
						delete(model, h)
					} else {
						kept = append(kept, tableSlot{h: h, st: st})
					}
				}
				tab.rebuild(kept)
			}
			if tab.used != len(model) || 4*tab.used > 3*len(tab.slots) {
				t.Fatalf("round %d op %d: %d used of %d slots, model has %d", round, op, tab.used, len(tab.slots), len(model))
			}
		}
		for h, st := range model {
			if got := tab.get(h); got != st {
				t.Fatalf("round %d: final get(%#x) = %p, want %p", round, h, got, st)
			}
		}
		n := 0
		for _, s := range tab.slots {
			if s.st != nil {
				n++
			}
		}
		if n != len(model) {
			t.Fatalf("round %d: %d slots in use, want %d", round, n, len(model))
		}
	}
}
