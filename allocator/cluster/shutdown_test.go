package cluster

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
)

// An Apply whose entry is committed but not yet applied when the node
// shuts down returns (its outcome unknown), even without a deadline: raft
// drops the entries queued for its FSM at shutdown and never answers
// their futures, so a caller waiting on one alone would wait forever.
// The FSM is held (its mutex) while a first entry is applied, a second
// is committed and queued behind it; then the node shuts down and the
// FSM is released: raft's FSM goroutine takes the queued entry or sees
// the shutdown first, either about half the time (so in 20 rounds, the
// queued entry is dropped in at least one but once in a million runs).
func TestApplyReturnsAtShutdown(t *testing.T) {
	dropped := 0
	for round := range 20 {
		c := newCluster(t, 1)
		nd := c.leader()
		fsm := nd.FSM()
		call := func(seq uint64) ledger.Command {
			return ledger.Acquire{Now: 1, Caller: ledger.Caller{SpenderID: "s", Epoch: 1, Sequence: seq},
				Keys: []ledger.AcquireKey{{Key: "k", Limits: testLimits, Want: ration.Amount{Requests: 1}}}}
		}
		c.apply(call(1)) // the node is the leader and has applied its first entry
		fsm.mu.Lock()
		errs := make(chan error, 2)
		apply := func(seq uint64) {
			last := nd.Raft().LastIndex()
			go func() {
				_, err := nd.Apply(context.Background(), call(seq))
				errs <- err
			}()
			pollUntil(t, fmt.Sprintf("entry %d committed", seq), func() bool { return nd.Raft().CommitIndex() > last })
		}
		apply(2) // taken by the FSM goroutine, which waits for the mutex
		apply(3) // queued behind it
		stopped := make(chan error, 1)
		go func() { stopped <- nd.Shutdown() }()
		pollUntil(t, "raft shut down", func() bool { return nd.Raft().State() == raft.Shutdown })
		fsm.mu.Unlock()
		c.down[0] = true // shut down here, not by the cleanup
		for range 2 {
			select {
			case err := <-errs:
				if err != nil && !errors.Is(err, ErrOutcomeUnknown) {
					t.Fatalf("round %d: Apply: %v, want nil or an unknown outcome", round, err)
				}
				if err != nil {
					dropped++
				}
			case <-time.After(waitFor):
				t.Fatalf("round %d: Apply did not return within %v of Shutdown", round, waitFor)
			}
		}
		if err := <-stopped; err != nil {
			t.Fatal(err)
		}
	}
	if dropped == 0 {
		t.Fatal("no round dropped the queued entry: the test did not reach the case it is for")
	}
}
