package spender

import "math/bits"

// keyTable is a shard's index of key states by their 64-bit hash: open
// addressing with linear probing over a power-of-two array of (hash,
// state) slots, at most three quarters full (measured faster than half
// full with 10k keys: the smaller table stays in cache). Keys whose hashes
// collide share a slot and are chained through keyState.next. A lookup reads one or two
// adjacent slots (16 bytes each) and nothing else, where a Go map reads
// its directory, a table, a control word and a slot: with 10k keys that
// is a cache miss less per admission (docs/results.md).
//
// Slots are only ever added between sweeps; a sweep rebuilds the table
// from the states it keeps (rebuild), so there are no tombstones.
type keyTable struct {
	slots []tableSlot // len is 0 or a power of two
	shift uint8       // 64 - log2(len(slots)): a slot's index is the hash's top bits
	used  int         // slots holding a state
}

type tableSlot struct {
	h  uint64
	st *keyState // the chain's head; nil: the slot is empty
}

const minTableSlots = 16

// get returns the chain of states whose key hashes to h, or nil.
func (t *keyTable) get(h uint64) *keyState {
	if len(t.slots) == 0 {
		return nil
	}
	// The top bits pick the slot: the low bits picked the shard, so every
	// hash in this table has the same low bits.
	mask := len(t.slots) - 1
	for i := int(h >> t.shift); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.st == nil {
			return nil
		}
		if s.h == h {
			return s.st
		}
	}
}

// set makes st (not nil) the chain for hash h, adding a slot if h has none.
func (t *keyTable) set(h uint64, st *keyState) {
	if 4*(t.used+1) > 3*len(t.slots) {
		t.resize(max(minTableSlots, 2*len(t.slots)))
	}
	mask := len(t.slots) - 1
	for i := int(h >> t.shift); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.st == nil {
			*s = tableSlot{h: h, st: st}
			t.used++
			return
		}
		if s.h == h {
			s.st = st
			return
		}
	}
}

// resize rehashes every slot into a table of n slots (a power of two).
func (t *keyTable) resize(n int) {
	old := t.slots
	t.slots = make([]tableSlot, n)
	t.shift = uint8(64 - bits.TrailingZeros(uint(n)))
	t.used = 0
	for _, s := range old {
		if s.st != nil {
			t.set(s.h, s.st)
		}
	}
}

// rebuild replaces the table's content with heads (each a chain's head,
// by hash), sized for them.
func (t *keyTable) rebuild(heads []tableSlot) {
	n := minTableSlots
	for 3*n < 4*len(heads) {
		n *= 2
	}
	if n == len(t.slots) {
		clear(t.slots)
	} else {
		t.slots = make([]tableSlot, n)
		t.shift = uint8(64 - bits.TrailingZeros(uint(n)))
	}
	t.used = 0
	for _, s := range heads {
		t.set(s.h, s.st)
	}
}
