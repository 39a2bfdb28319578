package allocator

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/internal/fakeclock"
)

// fakeClock is the repository's manual clock, started at a fixed instant.
type fakeClock = fakeclock.Clock

func newFakeClock() *fakeClock {
	c := fakeclock.New()
	c.Set(time.Unix(1_800_000_000, 0))
	return c
}

func newLedger(t *testing.T, clk ration.Clock, opts ...Option) *Ledger {
	t.Helper()
	l, err := New(append([]Option{WithClock(clk)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func openLedger(t *testing.T, path string, clk ration.Clock, opts ...Option) *Ledger {
	t.Helper()
	l, err := Open(path, append([]Option{WithClock(clk), withNoSync()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func tempDB(t *testing.T) string { return filepath.Join(t.TempDir(), "ledger.db") }

// tpm returns limits of n tokens per minute and 600 requests per minute.
func tpm(n int64) ration.Limits { return ration.Limits{RPM: 600, TPM: n} }

// acq runs one single-key Acquire and fails the test on error.
func acq(t *testing.T, l *Ledger, c ledger.Caller, k ledger.AcquireKey) ledger.AcquireResult {
	t.Helper()
	r, err := l.Acquire(context.Background(), c, []ledger.AcquireKey{k})
	if err != nil {
		t.Fatalf("Acquire(%+v, %+v): %v", c, k, err)
	}
	return r.Keys[0]
}

func caller(id string, epoch, seq uint64) ledger.Caller {
	return ledger.Caller{SpenderID: id, Epoch: epoch, Sequence: seq}
}

// dump returns the ledger's whole state, encoded, for "nothing changed"
// and "resumed exactly" checks.
func dump(l *Ledger) string {
	m := memoryOf(l)
	m.mu.Lock()
	defer m.mu.Unlock()
	return string(m.state.Snapshot())
}

// memoryOf is the state of l, a memory-only or durable Ledger, behind its
// mutex.
func memoryOf(l *Ledger) *memory {
	switch s := l.store.(type) {
	case *memory:
		return s
	case *journal:
		return s.memory
	}
	panic(fmt.Sprintf("a %T is not the store of a Ledger of one process", l.store))
}

// journalOf is the store of l, a durable Ledger.
func journalOf(l *Ledger) *journal { return l.store.(*journal) }

func wantErr(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error %v, want %v", err, target)
	}
}

// hold makes g behave as if a commit were in flight until the function it
// returns is called: calls queue and wait.
func hold(g *groupCommit) (release func()) {
	r := &commitRound{finished: make(chan struct{})}
	g.mu.Lock()
	g.inFlight = r
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		g.inFlight = nil
		close(r.finished)
		g.mu.Unlock()
	}
}
