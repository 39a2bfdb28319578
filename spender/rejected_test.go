package spender_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rationhq/ration"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// stricter forwards calls to a real allocator but first puts a rate beyond
// the protocol's bounds in one key's entry, so the allocator refuses that
// entry as invalid, as an allocator with stricter rules would: the refusal
// and its error are the allocator's own.
type stricter struct {
	spender.LeaseSource
	bad string

	mu      sync.Mutex
	sentBad int // calls whose body carried the bad key
}

func (s *stricter) Acquire(ctx context.Context, r *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	r = proto.Clone(r).(*leasev1.AcquireRequest)
	for _, k := range r.GetKeys() {
		if k.GetKey() == s.bad {
			s.mu.Lock()
			s.sentBad++
			s.mu.Unlock()
			k.Limits.Rpm = ration.MaxRate + 1
		}
	}
	return s.LeaseSource.Acquire(ctx, r)
}

func (s *stricter) badCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sentBad
}

// TestLeasedRejectedKeyFailsAlone: when the allocator refuses one key of a
// batch as invalid, that key alone fails, with the allocator's reason, and
// is never sent again; the rest of the batch is granted at once, the
// Limiter never falls back, and Close still returns every lease.
func TestLeasedRejectedKeyFailsAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clk bubbleClock
		strict := &stricter{LeaseSource: newAllocator(t, clk), bad: "poison"}
		src := gateFirst(strict) // the first call waits, so that the keys asked for meanwhile share the next
		l := newLimiter(t, clk, spender.WithLeases(src), spender.WithSpenderID("gw"), testTuning(time.Second))
		lim := ration.Limits{RPM: 600, TPM: 600_000}
		one := ration.Amount{Requests: 1, Tokens: 100}

		results := map[string]error{}
		paths := map[string]spender.Path{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		reserve := func(key string) {
			r, err := l.Reserve(t.Context(), key, lim, one)
			mu.Lock()
			defer mu.Unlock()
			results[key] = err
			if err == nil {
				paths[key] = spender.AdmissionPath(r)
				r.Settle(one)
			}
		}
		wg.Go(func() { reserve("warm") })
		synctest.Wait() // the first call is at the gate
		for _, k := range []string{"good-1", "poison", "good-2"} {
			wg.Go(func() { reserve(k) })
		}
		synctest.Wait() // all three wait for the next call
		close(src.gate)
		wg.Wait()

		for _, k := range []string{"warm", "good-1", "good-2"} {
			if results[k] != nil || paths[k] == spender.PathFallback {
				t.Errorf("%s: err %v, path %v; want admitted from a lease", k, results[k], paths[k])
			}
		}
		err := results["poison"]
		if !errors.Is(err, spender.ErrKeyRejected) || !strings.Contains(err.Error(), "limits.rpm") || !strings.Contains(err.Error(), `"poison"`) {
			t.Fatalf("poison: %v; want ErrKeyRejected naming the key and the allocator's reason (limits.rpm)", err)
		}
		if _, err := l.Reserve(t.Context(), "poison", lim, one); !errors.Is(err, spender.ErrKeyRejected) {
			t.Errorf("poison again: %v; want ErrKeyRejected without asking", err)
		}
		if n := strict.badCalls(); n != 1 {
			t.Errorf("the rejected key was sent in %d calls; want 1 (never retried)", n)
		}
		if err := l.Ready(); err != nil {
			t.Errorf("Ready: %v; one rejected key does not make the allocator unreachable", err)
		}
		// New limits are a new question: the key is asked for again.
		if _, err := l.Reserve(t.Context(), "poison", ration.Limits{RPM: 60, TPM: 60_000}, one); !errors.Is(err, spender.ErrKeyRejected) {
			t.Errorf("poison with new limits: %v; want the allocator's answer (rejected again by this allocator)", err)
		}
		if n := strict.badCalls(); n != 2 {
			t.Errorf("after new limits the key was sent in %d calls; want 2", n)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}
