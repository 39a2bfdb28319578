package allocator

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/rationhq/ration"
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
func acq(t *testing.T, l *Ledger, c Caller, k AcquireKey) AcquireResult {
	t.Helper()
	r, err := l.Acquire(context.Background(), c, []AcquireKey{k})
	if err != nil {
		t.Fatalf("Acquire(%+v, %+v): %v", c, k, err)
	}
	return r.Keys[0]
}

func caller(id string, epoch, seq uint64) Caller {
	return Caller{SpenderID: id, Epoch: epoch, Sequence: seq}
}

// dump returns the ledger's whole state, encoded, for "nothing changed"
// and "resumed exactly" checks.
func dump(l *Ledger) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.state.Snapshot())
}

func wantErr(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error %v, want %v", err, target)
	}
}
