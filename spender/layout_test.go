package spender

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"
	"unsafe"

	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
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

// nopSource is a LeaseSource that is never reached (manual leasing sends
// nothing until asked).
type nopSource struct{}

func (nopSource) Acquire(context.Context, *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	return nil, errors.New("nop")
}

func (nopSource) ReserveAhead(context.Context, *leasev1.ReserveAheadRequest) (*leasev1.ReserveAheadResponse, error) {
	return nil, errors.New("nop")
}

func (nopSource) Release(context.Context, *leasev1.ReleaseRequest) (*leasev1.ReleaseResponse, error) {
	return nil, errors.New("nop")
}

// TestLeaseOfMatchesLs: leaseOf's address arithmetic (leaseAddr, without
// the fallback to st.ls) gives st.ls for every state a leased Limiter
// holds, and for a leasedKey built by hand.
func TestLeaseOfMatchesLs(t *testing.T) {
	var lk leasedKey
	lk.keyState.ls = &lk.leaseState
	if got := leaseAddr(&lk.keyState); got != &lk.leaseState {
		t.Fatalf("leaseAddr = %p, want %p", got, &lk.leaseState)
	}
	l := New(SystemClock{}, WithLeases(nopSource{}), WithManualLeasing())
	defer func() {
		// Nothing was granted, so there is nothing to give back; the
		// source refuses anyway, so do not wait for it.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		_ = l.Close(ctx)
	}()
	for i := range 1000 {
		_, err := l.Reserve(context.Background(), "k"+strconv.Itoa(i), Limits{RPM: 60, TPM: 6000}, Cost{Requests: 1, Tokens: 10})
		if !errors.Is(err, ErrLeasePending) {
			t.Fatalf("key %d: %v, want ErrLeasePending", i, err)
		}
	}
	n := 0
	for i := range l.shards {
		for _, s := range l.shards[i].keys.slots {
			for st := s.st; st != nil; st = st.next {
				n++
				if st.ls == nil || leaseAddr(st) != st.ls {
					t.Fatalf("key %q: leaseAddr = %p, st.ls = %p", st.key, leaseAddr(st), st.ls)
				}
			}
		}
	}
	if n != 1000 {
		t.Fatalf("%d states, want 1000", n)
	}
}
