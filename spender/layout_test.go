package spender

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/rationhq/ration"
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
	// The lease's fields every admission touches are the leaseState itself:
	// two cache lines, right before the keyState (offset 0 and 128).
	if sz := unsafe.Sizeof(leaseState{}); sz > 128 || ks != 128 {
		t.Errorf("leaseState is %d bytes and the keyState starts at %d, want at most 128 and 128", sz, ks)
	}
	// 384 bytes: a size class whose objects start on 128-byte boundaries
	// (384 = 3 × 128, spans are page-aligned) and which the GC scans span by
	// span (objects up to 512 bytes); every leased key is marked by each GC
	// cycle, so its size is paid for over and over.
	if sz := unsafe.Sizeof(lk); sz > 384 {
		t.Errorf("leasedKey is %d bytes, want at most 384", sz)
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
	l := New(ration.SystemClock{}, WithLeases(nopSource{}), WithManualLeasing())
	defer func() {
		// Nothing was granted, so there is nothing to give back; the
		// source refuses anyway, so do not wait for it.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		_ = l.Close(ctx)
	}()
	for i := range 1000 {
		_, err := l.Reserve(context.Background(), "k"+strconv.Itoa(i), ration.Limits{RPM: 60, TPM: 6000}, ration.Amount{Requests: 1, Tokens: 10})
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
