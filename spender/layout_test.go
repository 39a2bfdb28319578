package spender

import (
	"testing"
	"unsafe"
)

// TestLeasedKeyLayout keeps the cache-line layout the hot paths rely on
// (see keyState and leaseState): the fields every admission reads fill the
// keyState's first 64 bytes, and in a leasedKey the lease's hot fields are
// the two cache lines right before it. Objects of leasedKey's size class
// start on a 64-byte boundary, so these are whole lines.
func TestLeasedKeyLayout(t *testing.T) {
	var st keyState
	for name, end := range map[string]uintptr{
		"key": unsafe.Offsetof(st.key) + unsafe.Sizeof(st.key),
		"lim": unsafe.Offsetof(st.lim) + unsafe.Sizeof(st.lim),
		"ls":  unsafe.Offsetof(st.ls) + unsafe.Sizeof(st.ls),
		"kl":  unsafe.Offsetof(st.kl) + unsafe.Sizeof(st.kl),
	} {
		if end > 64 {
			t.Errorf("keyState.%s ends at byte %d, outside the first cache line", name, end)
		}
	}
	var lk leasedKey
	ks := unsafe.Offsetof(lk.keyState)
	if ks%64 != 0 {
		t.Errorf("leasedKey.keyState at byte %d, not on a cache line", ks)
	}
	var ls leaseState
	hot := unsafe.Offsetof(ls.expiry)
	if ks-hot > 128 {
		t.Errorf("the lease's hot fields start %d bytes before the keyState, want at most 128", ks-hot)
	}
	for name, off := range map[string]uintptr{
		"avail": unsafe.Offsetof(ls.avail), "outstanding": unsafe.Offsetof(ls.outstanding),
		"lowWater": unsafe.Offsetof(ls.lowWater), "spentTotal": unsafe.Offsetof(ls.spentTotal),
		"lastCost": unsafe.Offsetof(ls.lastCost), "lastUse": unsafe.Offsetof(ls.lastUse),
		"snapRem": unsafe.Offsetof(ls.snapRem), "snapAt": unsafe.Offsetof(ls.snapAt),
		"gen": unsafe.Offsetof(ls.gen), "queued": unsafe.Offsetof(ls.queued),
		"inCall": unsafe.Offsetof(ls.inCall), "hasSnap": unsafe.Offsetof(ls.hasSnap),
	} {
		if off < hot {
			t.Errorf("leaseState.%s at byte %d, before the hot fields (from %d)", name, off, hot)
		}
	}
	// Go's size classes above 512 bytes are multiples of 64 (576, 640,
	// 704, ...), so such objects start on a cache line.
	// And it fits the 576-byte class: every leased key is marked by each GC
	// cycle, so its size is paid for over and over.
	if sz := unsafe.Sizeof(lk); sz <= 512 || sz > 576 {
		t.Errorf("leasedKey is %d bytes, want 513 to 576", sz)
	}
}
