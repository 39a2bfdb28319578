package allocator

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/internal/boundcheck"
	bolt "go.etcd.io/bbolt"
)

func TestStoreResumesExactly(t *testing.T) {
	clk := newFakeClock()
	path := tempDB(t)
	l := openLedger(t, path, clk)
	k := []ledger.AcquireKey{
		{Key: "k1", Limits: tpm(600), Want: ration.Amount{Requests: 1, Tokens: 100}},
		{Key: "k2", Limits: ration.Limits{RPM: 60, TPM: 6000, BurstTokens: 9000}, Want: ration.Amount{Requests: 2, Tokens: 700}, Debt: ration.Amount{Requests: 0, Tokens: 50}},
	}
	r1, err := l.Acquire(ctx, caller("a", 1, 1), k)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.ReserveAhead(ctx, caller("b", 3, 7), []ledger.ReserveKey{{Key: "k1", Limits: tpm(600), Cost: ration.Amount{Requests: 1, Tokens: 550}, MaxWait: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Release(ctx, caller("c", 1, 1), []ledger.ReleaseKey{{Key: "k3", Limits: tpm(60), Debt: ration.Amount{Requests: 0, Tokens: 5}}}); err != nil {
		t.Fatal(err)
	}
	before := dump(l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = l.Acquire(ctx, caller("a", 1, 2), k)
	wantErr(t, err, ErrClosed)

	l2 := openLedger(t, path, clk)
	defer l2.Close()
	if got := dump(l2); got != before {
		t.Fatal("state after reopening differs")
	}
	r2, err := l2.Acquire(ctx, caller("a", 1, 1), k)
	if err != nil {
		t.Fatal(err)
	}
	// The stored reply, but for the snapshots: the durable copy leaves them
	// out, and a retry after a restart gets them from the keys' state now
	// (k1's tokens went to b's reservation since).
	if boundcheck.SansSnapshots(r2) != boundcheck.SansSnapshots(r1) {
		t.Fatalf("retry after restart: %+v, want stored %+v", *r2, *r1)
	}
	if s := r2.Keys[0].Snapshot.Tokens; s.Limit != 600 || s.Remaining != 0 {
		t.Fatalf("retry after restart: k1 tokens snapshot %+v, want limit 600, none remaining", s)
	}
	if r2.Keys[1].Snapshot != r1.Keys[1].Snapshot {
		t.Fatalf("retry after restart: k2 snapshot %+v, want %+v (unchanged key)", r2.Keys[1].Snapshot, r1.Keys[1].Snapshot)
	}
	_, err = l2.Acquire(ctx, caller("c", 1, 2), k)
	wantErr(t, err, ledger.ErrEpochReleased)
}

func TestStoreCrashBeforeCommitLosesOnlyUnansweredCalls(t *testing.T) {
	clk := newFakeClock()
	path := tempDB(t)
	var fail bool
	var mu sync.Mutex
	hook := withHook(func(string) error {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			return errors.New("injected crash")
		}
		return nil
	})
	l := openLedger(t, path, clk, hook)
	k := []ledger.AcquireKey{{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 100}}}
	if _, err := l.Acquire(ctx, caller("a", 1, 1), k); err != nil {
		t.Fatal(err)
	}
	durable := dump(l)
	mu.Lock()
	fail = true
	mu.Unlock()
	_, err := l.Acquire(ctx, caller("a", 1, 2), k)
	wantErr(t, err, ErrNotDurable)
	// The retry cannot be answered while the commit fails either.
	_, err = l.Acquire(ctx, caller("a", 1, 2), k)
	wantErr(t, err, ErrNotDurable)
	l.Close() // a crash: the failed commit never reached the disk

	l2 := openLedger(t, path, clk)
	defer l2.Close()
	if dump(l2) != durable {
		t.Fatal("state after the crash is not the last durable state")
	}
	r, err := l2.Acquire(ctx, caller("a", 1, 2), k)
	if err != nil || r.Keys[0].Granted.Tokens != 100 || r.Keys[0].Snapshot.Tokens.Remaining != 400 {
		t.Fatalf("retry after the crash: %+v %v, want it applied once", r, err)
	}
}

// TestStoreFailedCommitIsWrittenByTheNext: a commit fails (its calls get
// ErrNotDurable but stay applied in memory); the process goes on, and the
// next commit must write their changes too, so that the state on disk is
// again the state in memory.
func TestStoreFailedCommitIsWrittenByTheNext(t *testing.T) {
	for _, stage := range []string{"before", "after"} {
		t.Run(stage, func(t *testing.T) { testFailedCommitIsWrittenByTheNext(t, stage) })
	}
}

func testFailedCommitIsWrittenByTheNext(t *testing.T, failAt string) {
	clk := newFakeClock()
	path := tempDB(t)
	var fail atomic.Bool
	l := openLedger(t, path, clk, withHook(func(stage string) error {
		if fail.Load() && stage == failAt {
			return errors.New("injected I/O error")
		}
		return nil
	}))
	k := func(name string) ledger.AcquireKey {
		return ledger.AcquireKey{Key: name, Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 100}}
	}
	acq(t, l, caller("a", 1, 1), k("k1"))
	fail.Store(true)
	_, err := l.Acquire(ctx, caller("a", 1, 2), []ledger.AcquireKey{k("k1"), k("k2")})
	wantErr(t, err, ErrNotDurable)
	_, err = l.Acquire(ctx, caller("b", 1, 1), []ledger.AcquireKey{k("k2")})
	wantErr(t, err, ErrNotDurable)
	fail.Store(false)
	// Only k3 and c's session change in this call; its commit must carry
	// the failed ones' changes to k1, k2 and the sessions of a and b.
	acq(t, l, caller("c", 1, 1), k("k3"))
	if _, err := l.Acquire(ctx, caller("a", 1, 2), []ledger.AcquireKey{k("k1"), k("k2")}); err != nil {
		t.Fatalf("a's retry once commits succeed: %v", err)
	}
	l2 := reopenSame(t, l, path, clk)
	defer l2.Close()
	if got := acq(t, l2, caller("b", 1, 1), k("k2")); got.Granted.Tokens != 100 || got.Snapshot.Tokens.Remaining != 400 {
		t.Fatalf("b's retry after reopening: %+v, want its stored grant (k2 granted to a and b)", got)
	}
}

func TestStoreKeyNotVouchedForStartsEmpty(t *testing.T) {
	clk := newFakeClock()
	path := tempDB(t)
	l := openLedger(t, path, clk)
	acq(t, l, caller("a", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 100}})
	acq(t, l, caller("a", 1, 2), ledger.AcquireKey{Key: "ok", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 100}})
	l.Close()
	openLedger(t, path, clk).Close() // replays the journal into the buckets
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketKeys).Put([]byte("k"), []byte{2, 0, 0xff}); err != nil {
			return err
		}
		return tx.Bucket(bucketSessions).Put([]byte("a"), []byte{9})
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	l2 := openLedger(t, path, clk)
	// The damaged records were replaced by what the state vouches for: a
	// restart resumes the empty key exactly, rather than emptying it again.
	before := dump(l2)
	l2.Close()
	clk.Advance(time.Second)
	l2 = openLedger(t, path, clk)
	defer l2.Close()
	if dump(l2) != before {
		t.Fatal("a second restart did not resume the key found damaged by the first")
	}
	// The lost key is empty and refills from a TTL (10 s) after the
	// recovery, when every lease granted before the loss has expired: at
	// 1 s, 10 tokens are 9 s + 1 s away.
	r := acq(t, l2, caller("b", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Need: ration.Amount{Tokens: 10}, Returned: ration.Amount{Requests: 0, Tokens: 10}})
	if r.Status != ledger.StatusNotCovered || r.RetryAfter != 10*time.Second || r.Returned != (ration.Amount{}) {
		t.Fatalf("lost key: %+v, want not covered for 10 s and no return credited", r)
	}
	r = acq(t, l2, caller("b", 1, 2), ledger.AcquireKey{Key: "ok", Limits: tpm(600)})
	if r.Snapshot.Tokens.Remaining != 510 || r.ActiveSpenders != 2 {
		t.Fatalf("intact key: %+v", r)
	}
	// The forgotten session: a's holding on "ok" still records sequence 2,
	// so a repeat of that call changes nothing there.
	r = acq(t, l2, caller("a", 1, 2), ledger.AcquireKey{Key: "ok", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 100}})
	if r.Granted != (ration.Amount{}) {
		t.Fatalf("repeat after a lost session granted %+v", r.Granted)
	}
	clk.Advance(10 * time.Second)
	r = acq(t, l2, caller("b", 1, 3), ledger.AcquireKey{Key: "k", Limits: tpm(600), Need: ration.Amount{Tokens: 10}})
	if r.Status != ledger.StatusOK || r.Granted.Tokens != 10 {
		t.Fatalf("lost key after its refill began: %+v, want 10 tokens granted", r)
	}
}

// TestStoreConcurrentCallsArePrefixConsistent runs many concurrent
// spenders against a durable ledger (several group commits), then reopens
// it: the state must equal the in-memory state at close.
func TestStoreConcurrentCallsArePrefixConsistent(t *testing.T) {
	clk := newFakeClock()
	path := tempDB(t)
	l := openLedger(t, path, clk)
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("s%d", g)
			for i := uint64(1); i <= 40; i++ {
				keys := []ledger.AcquireKey{
					{Key: fmt.Sprintf("k%d", i%5), Limits: tpm(6000), Want: ration.Amount{Requests: 1, Tokens: 10}, Returned: ration.Amount{Requests: 0, Tokens: 3}, Held: ration.Amount{Requests: 0, Tokens: 5}},
					{Key: fmt.Sprintf("k%d", (i+1)%5), Limits: tpm(6000), Want: ration.Amount{Requests: 1, Tokens: 10}},
				}
				if _, err := l.Acquire(ctx, caller(id, 1, i), keys); err != nil {
					t.Error(err)
					return
				}
				if i%10 == 0 {
					clk.Advance(time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	reopenSame(t, l, path, clk).Close()
}

func TestOpenRejectsOtherFormats(t *testing.T) {
	path := tempDB(t)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error {
		b, _ := tx.CreateBucketIfNotExists(bucketMeta)
		return b.Put(metaFormat, []byte("something-else/9"))
	})
	db.Close()
	if _, err := Open(path); err == nil {
		t.Fatal("opened a store of another format")
	}
}

// TestStoreCheckpointKeepsState forces checkpoints between calls: state
// replayed from the journal and state read from the buckets must agree.
func TestStoreCheckpointKeepsState(t *testing.T) {
	clk := newFakeClock()
	path := tempDB(t)
	l := openLedger(t, path, clk)
	for i := uint64(1); i <= 30; i++ {
		keys := []ledger.AcquireKey{{Key: fmt.Sprintf("k%d", i%7), Limits: tpm(600), Want: ration.Amount{Requests: 1, Tokens: 10}, Held: ration.Amount{Requests: 0, Tokens: 5}}}
		if _, err := l.Acquire(ctx, caller("a", 1, i), keys); err != nil {
			t.Fatal(err)
		}
		if i%4 == 0 {
			if err := journalOf(l).checkpoint(); err != nil {
				t.Fatal(err)
			}
		}
		if i == 20 {
			clk.Advance(time.Hour)
			if _, _, err := l.Sweep(ctx); err != nil { // deletions go through the journal too
				t.Fatal(err)
			}
		}
	}
	l2 := reopenSame(t, l, path, clk)
	defer l2.Close()
	var journal int
	journalOf(l2).db.View(func(tx *bolt.Tx) error { journal = tx.Bucket(bucketJournal).Stats().KeyN; return nil })
	if journal != 0 {
		t.Fatalf("journal holds %d entries after open", journal)
	}
}

// TestStoreCheckpointsDuringConcurrentCalls forces checkpoints while many
// spenders call (a checkpoint and the group commits queue on bbolt's
// writer): the state after reopening must be the state at close.
func TestStoreCheckpointsDuringConcurrentCalls(t *testing.T) {
	clk := newFakeClock()
	path := tempDB(t)
	l := openLedger(t, path, clk)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			id := fmt.Sprintf("s%d", g)
			for i := uint64(1); i <= 60; i++ {
				keys := []ledger.AcquireKey{{Key: fmt.Sprintf("k%d", i%7), Limits: tpm(6000), Want: ration.Amount{Requests: 1, Tokens: 10}, Held: ration.Amount{Requests: 0, Tokens: 5}}}
				if _, err := l.Acquire(ctx, caller(id, 1, i), keys); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for checkpoints := 0; ; checkpoints++ {
		select {
		case <-done:
			if checkpoints == 0 {
				t.Fatal("no checkpoint ran during the calls")
			}
			reopenSame(t, l, path, clk).Close()
			return
		default:
			if err := journalOf(l).checkpoint(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// reopenSame closes l, opens its store again and fails the test unless the
// reopened ledger's state is exactly l's.
func reopenSame(t *testing.T, l *Ledger, path string, clk ration.Clock) *Ledger {
	t.Helper()
	before := dump(l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2 := openLedger(t, path, clk)
	if dump(l2) != before {
		l2.Close()
		t.Fatal("state after reopening differs from the state at close")
	}
	return l2
}

// TestCommitLingerSteps: a commit lingers in steps, at most the configured
// linger, and not once lingerCalls calls wait. After a light cycle (the
// previous batch, last, below sustainedBatch) a step without a call ends
// it; after a sustained one, only once the batch is as large as the last.
func TestCommitLingerSteps(t *testing.T) {
	s := lingerStep
	for _, tc := range []struct {
		max      time.Duration
		last     int // calls in the previous commit cycle
		arriving int // steps during which calls arrive
		perStep  int // calls arriving in each of them (3 if 0)
		want     []time.Duration
	}{
		{4 * time.Millisecond, 2, 100, lingerCalls / 2, []time.Duration{s, s}},
		{4 * time.Millisecond, 2, 100, lingerCalls, []time.Duration{s}},
		{4 * time.Millisecond, 2, 0, 0, []time.Duration{s}},
		{4 * time.Millisecond, 2, 1, 0, []time.Duration{s, s}},
		{4 * time.Millisecond, 2, 2, 0, []time.Duration{s, s, s}},
		{4 * time.Millisecond, 2, 100, 0, []time.Duration{s, s, s, s}},
		{300 * time.Microsecond, 2, 100, 0, []time.Duration{300 * time.Microsecond}},
		{2500 * time.Microsecond, 2, 100, 0, []time.Duration{s, s, 500 * time.Microsecond}},
		// Sustained: quiet steps do not end it while the batch is smaller
		// than the last one (bursts), they do once it is as large (a
		// closed population of callers, all of them waiting).
		{4 * time.Millisecond, 32, 0, 0, []time.Duration{s, s, s, s}},
		{4 * time.Millisecond, 32, 1, 0, []time.Duration{s, s, s, s}},
		{8 * time.Millisecond, 32, 2, 20, []time.Duration{s, s, s}},
		{8 * time.Millisecond, 32, 100, lingerCalls / 2, []time.Duration{s, s}},
		{2500 * time.Microsecond, 32, 0, 0, []time.Duration{s, s, 500 * time.Microsecond}},
	} {
		g := newGroupCommit(tc.max, nil)
		var slept []time.Duration
		g.sleep = func(d time.Duration) {
			slept = append(slept, d)
			if len(slept) <= tc.arriving {
				g.mu.Lock()
				g.arrived += max(tc.perStep, 3)
				g.mu.Unlock()
			}
		}
		g.lingerFor(tc.max, tc.last)
		if fmt.Sprint(slept) != fmt.Sprint(tc.want) {
			t.Errorf("linger(%v, last %d) with calls arriving in the first %d steps (%d each) slept %v, want %v", tc.max, tc.last, tc.arriving, tc.perStep, slept, tc.want)
		}
	}
}

// TestSecondOpenNamesTheLock: a second ledger on the same file waits for
// bbolt's lock, then fails saying what holds it.
func TestSecondOpenNamesTheLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "allocator.db")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := Open(path); err == nil || !strings.Contains(err.Error(), "another process holds its lock") {
		t.Fatalf("second Open: %v, want an error naming the lock", err)
	}
}

// TestOpenRefusesADamagedStore: a store cut short, emptied, or with bytes
// flipped in its pages is refused by Open with an error naming the file
// and saying it is damaged, never a panic; the sound file it was made
// from opens.
func TestOpenRefusesADamagedStore(t *testing.T) {
	path := tempDB(t)
	l := openLedger(t, path, newFakeClock())
	for i := range 3000 {
		if _, err := l.Acquire(ctx, caller(fmt.Sprintf("s%d", i%50), 1, uint64(1+i/50)), []ledger.AcquireKey{{Key: fmt.Sprintf("key-%d", i), Limits: tpm(600)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := os.Getpagesize()
	for name, damage := range map[string]func([]byte) []byte{
		"cut in half": func(b []byte) []byte { return b[:len(b)/2] },
		"emptied":     func([]byte) []byte { return nil },
		"data pages flipped": func(b []byte) []byte {
			for p := 2; p < len(b)/page; p += 3 {
				b[p*page+8] ^= 0x5a // the page's flags and count
			}
			return b
		},
	} {
		t.Run(name, func(t *testing.T) {
			bad := filepath.Join(t.TempDir(), "allocator.db")
			if err := os.WriteFile(bad, damage(append([]byte{}, data...)), 0o600); err != nil {
				t.Fatal(err)
			}
			l, err := Open(bad)
			if err == nil {
				l.Close()
				t.Fatal("opened")
			}
			if !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "is damaged") {
				t.Fatalf("%v: want the file named and damage said", err)
			}
		})
	}
	l, err = Open(path)
	if err != nil {
		t.Fatalf("the sound file: %v", err)
	}
	l.Close()
}
