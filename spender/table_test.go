package spender

import (
	"fmt"
	"strconv"
	"testing"
)

// TestKeyTable drives a keyTable and a map with the same sets, gets and
// rebuilds, with hashes that collide outright (chains) or share their top
// bits (the slot), so probes run into each other and wrap around.
func TestKeyTable(t *testing.T) {
	tests := []struct {
		name string
		hash func(i int) uint64
	}{
		{"distinct", func(i int) uint64 { return uint64(i) * 0x9e3779b97f4a7c15 }},
		{"same top bits", func(i int) uint64 { return ^uint64(i) }},            // one probe run from the last slot, wrapping
		{"equal hashes", func(i int) uint64 { return uint64(i%3) << 61 }},      // three chains
		{"mixed", func(i int) uint64 { return uint64(i%7)<<60 | uint64(i%5) }}, // chains in one probe run
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tab keyTable
			model := map[string]*keyState{}
			hashOf := map[string]uint64{}
			check := func(when string) {
				t.Helper()
				if tab.n != len(model) || 4*tab.used > 3*len(tab.slots) {
					t.Fatalf("%s: n %d, %d of %d slots used; want n %d", when, tab.n, tab.used, len(tab.slots), len(model))
				}
				for key, st := range model {
					if got := tab.get(hashOf[key], key); got != st {
						t.Fatalf("%s: get(%q) = %p, want %p", when, key, got, st)
					}
				}
				if got := tab.get(hashOf["k0"], "absent"); got != nil {
					t.Fatalf("%s: get(absent) = %p", when, got)
				}
				n := 0
				for st := range tab.all() {
					if model[st.key] != st {
						t.Fatalf("%s: all yields %q, not in the model", when, st.key)
					}
					n++
				}
				if n != len(model) {
					t.Fatalf("%s: all yields %d states, want %d", when, n, len(model))
				}
			}
			check("empty")
			for round := range 3 {
				for i := range 100 {
					key := fmt.Sprint("k", round*100+i)
					st := &keyState{key: key}
					hashOf[key] = tt.hash(round*100 + i)
					tab.set(hashOf[key], st)
					model[key] = st
				}
				check(fmt.Sprint("round ", round, " after sets"))
				// A sweep that keeps every third state.
				tab.rebuild(func(st *keyState) bool {
					if i, _ := strconv.Atoi(st.key[1:]); i%3 != 0 {
						delete(model, st.key)
						return false
					}
					return true
				})
				check(fmt.Sprint("round ", round, " after rebuild"))
			}
			tab.rebuild(func(*keyState) bool { return false })
			clear(model)
			check("all dropped")
		})
	}
}
