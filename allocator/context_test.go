package allocator

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/cluster"
	"github.com/rationhq/ration/allocator/ledger"
)

// wantAbandoned fails the test unless err is an *AbandonedError for ctxErr
// with the given outcome.
func wantAbandoned(t *testing.T, err, ctxErr error, applied, unknown bool) {
	t.Helper()
	var ae *AbandonedError
	if !errors.As(err, &ae) || !errors.Is(err, ctxErr) || ae.Applied != applied || ae.Unknown != unknown ||
		errors.Is(err, cluster.ErrOutcomeUnknown) != unknown {
		t.Fatalf("error %v, want an AbandonedError for %v with Applied %v, Unknown %v", err, ctxErr, applied, unknown)
	}
}

// A call whose context has ended is refused before it is applied, on
// every kind of Ledger.
func TestEndedContextIsNotApplied(t *testing.T) {
	clk := newFakeClock()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	k := []ledger.AcquireKey{{Key: "k", Limits: tpm(600), Want: ration.Amount{Tokens: 100}}}
	for name, l := range map[string]*Ledger{"memory": newLedger(t, clk), "journal": openLedger(t, tempDB(t), clk)} {
		t.Run(name, func(t *testing.T) {
			defer l.Close()
			before := dump(l)
			_, err := l.Acquire(done, caller("a", 1, 1), k)
			wantAbandoned(t, err, context.Canceled, false, false)
			_, err = l.ReserveAhead(done, caller("a", 1, 1), []ledger.ReserveKey{{Key: "k", Limits: tpm(600), Cost: ration.Amount{Tokens: 1}}})
			wantAbandoned(t, err, context.Canceled, false, false)
			_, err = l.Release(done, caller("a", 1, 1), nil)
			wantAbandoned(t, err, context.Canceled, false, false)
			if _, _, err := l.Sweep(done); !errors.Is(err, context.Canceled) {
				t.Fatalf("Sweep: %v, want context.Canceled", err)
			}
			if dump(l) != before {
				t.Fatal("a call with an ended context changed the state")
			}
			if _, err := l.Acquire(ctx, caller("a", 1, 1), k); err != nil {
				t.Fatalf("the same call with a live context: %v", err)
			}
		})
	}
}

// TestJournalWaitAbandoned: a call whose context ends while it waits for
// another call's commit returns at once, applied: the commit it waited
// for, and its own, go on, and the same call sent again gets its stored
// reply, applied once.
func TestJournalWaitAbandoned(t *testing.T) {
	clk := newFakeClock()
	path := tempDB(t)
	inCommit, release := make(chan struct{}, 1), make(chan struct{})
	var hold atomic.Bool
	l := openLedger(t, path, clk, WithCommitLinger(0), withHook(func(stage string) error {
		if stage == "before" && hold.CompareAndSwap(true, false) {
			inCommit <- struct{}{}
			<-release
		}
		return nil
	}))
	defer l.Close()
	k := func(want int64) []ledger.AcquireKey {
		return []ledger.AcquireKey{{Key: "k", Limits: tpm(600), Want: ration.Amount{Tokens: want}}}
	}
	acq(t, l, caller("warm-up", 1, 1), k(0)[0])
	hold.Store(true)
	first := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, caller("a", 1, 1), k(100))
		first <- err
	}()
	<-inCommit // a's commit is in flight, held
	cctx, cancel := context.WithCancel(ctx)
	second := make(chan error, 1)
	go func() {
		_, err := l.Acquire(cctx, caller("b", 1, 1), k(200))
		second <- err
	}()
	time.Sleep(20 * time.Millisecond) // b applies and waits for a's commit
	cancel()
	select {
	case err := <-second:
		wantAbandoned(t, err, context.Canceled, true, false)
	case <-time.After(10 * time.Second):
		t.Fatal("the abandoned call did not return while the commit it waited for was held")
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	r, err := l.Acquire(ctx, caller("b", 1, 1), k(200))
	if err != nil || r.Keys[0].Granted.Tokens != 200 || r.Keys[0].Snapshot.Tokens.Remaining != 300 {
		t.Fatalf("b sent again: %+v %v, want its stored reply (200 granted, 300 left: applied once)", r, err)
	}
	l.Close()
	l2 := openLedger(t, path, clk)
	defer l2.Close()
	if r, err := l2.Acquire(ctx, caller("b", 1, 1), k(200)); err != nil || r.Keys[0].Snapshot.Tokens.Remaining != 300 {
		t.Fatalf("b after a restart: %+v %v, want its stored reply: durable", r, err)
	}
}

// TestReplicatedWaitAbandoned: on a cluster member, a call whose context
// ends while it is queued for the next entry is dropped, not applied; one
// whose context ends once its entry is proposed has an unknown outcome,
// and the same call sent to the leader is applied once.
func TestReplicatedWaitAbandoned(t *testing.T) {
	t.Run("queued", func(t *testing.T) {
		m := newMembers(t, 1)
		l := m.led[m.leader()]
		r := l.rep
		k := []ledger.AcquireKey{{Key: "k", Limits: tpm(600), Want: ration.Amount{Tokens: 100}}}
		if _, err := l.Acquire(ctx, caller("warm-up", 1, 1), k); err != nil {
			t.Fatal(err)
		}
		held := hold(r.gc)
		cctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() {
			_, err := l.Acquire(cctx, caller("a", 1, 1), k)
			errc <- err
		}()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			r.mu.Lock()
			queued := len(r.queue)
			r.mu.Unlock()
			if queued == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the call was not queued")
			}
		}
		cancel()
		wantAbandoned(t, <-errc, context.Canceled, false, false)
		held()
		before := l.Stats()
		// The next call flushes the queue: the dropped call is skipped.
		if _, err := l.Acquire(ctx, caller("warm-up", 1, 2), k); err != nil {
			t.Fatal(err)
		}
		if after := l.Stats(); after.Sessions != before.Sessions {
			t.Fatalf("sessions %d after the flush, %d before: the dropped call was applied", after.Sessions, before.Sessions)
		}
		res, err := l.Acquire(ctx, caller("a", 1, 1), k)
		if err != nil || res.Keys[0].Snapshot.Tokens.Remaining != 300 {
			t.Fatalf("a sent again: %+v %v, want it applied now (300 left after warm-up's two and its own)", res, err)
		}
	})
	t.Run("proposed", func(t *testing.T) {
		m := newMembers(t, 3)
		lead := m.leader()
		k := []ledger.AcquireKey{{Key: "k", Limits: tpm(600), Want: ration.Amount{Tokens: 100}}}
		if _, err := m.led[lead].Acquire(ctx, caller("warm-up", 1, 1), k); err != nil {
			t.Fatal(err)
		}
		// A leader cut off from the majority proposes the call, which cannot
		// commit; the context ends first (well within the leader lease).
		m.disconnect(lead)
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := m.led[lead].Acquire(cctx, caller("a", 1, 1), k)
		wantAbandoned(t, err, context.DeadlineExceeded, false, true)
		m.reconnect(lead)
		next := m.leader()
		res, err := m.led[next].Acquire(ctx, caller("a", 1, 1), k)
		if err != nil || res.Keys[0].Granted.Tokens != 100 || res.Keys[0].Snapshot.Tokens.Remaining != 400 {
			t.Fatalf("a sent to the leader: %+v %v, want it applied once", res, err)
		}
		ref, _ := m.reference()
		for _, c := range []ledger.Caller{caller("warm-up", 1, 1), caller("a", 1, 1)} {
			if _, err := ref.Acquire(ctx, c, k); err != nil {
				t.Fatal(err)
			}
		}
		m.converge(memoryOf(ref).state.Snapshot())
	})
}
