package spender_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/testkit"
	"github.com/rationhq/ration/spender"
)

// TestDuplicateSpenderIsReported: two live Limiters with one spender id
// are a deployment error. The older one, refused for a stale epoch after
// its own calls were answered, reports it (Ready, Close, an ERROR log) and
// stops calling the allocator instead of taking the id back; the newer
// one is never refused.
func TestDuplicateSpenderIsReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clk bubbleClock
		alloc := newAllocator(t, clk)
		lim := ration.Limits{RPM: 600, TPM: 600_000}
		one := ration.Amount{Requests: 1, Tokens: 100}
		logs := &testkit.SyncBuffer{}
		oldNet, newNet := &simnet{src: alloc}, &simnet{src: alloc}
		older := newLimiter(t, clk, spender.WithLeases(oldNet), spender.WithSpenderID("gw"), testTuning(time.Second), spender.WithLogger(testLogger(logs)))
		if _, err := older.Reserve(t.Context(), "a", lim, one); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // a later start: a higher epoch
		newer := newLimiter(t, clk, spender.WithLeases(newNet), spender.WithSpenderID("gw"), testTuning(time.Second))
		if _, err := newer.Reserve(t.Context(), "b", lim, one); err != nil {
			t.Fatal(err)
		}

		// The older one needs the allocator for a new key and is refused.
		r, err := older.Reserve(t.Context(), "c", lim, one)
		if err == nil && spender.AdmissionPath(r) != spender.PathFallback {
			t.Fatalf("older spender admitted a new key from the allocator after the id moved on")
		}
		if err := older.Ready(); !errors.Is(err, spender.ErrDuplicateSpender) || !strings.Contains(err.Error(), `"gw"`) {
			t.Fatalf("older Ready: %v; want ErrDuplicateSpender naming the id", err)
		}
		if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "another live process") {
			t.Errorf("older spender's logs do not report the duplicate:\n%s", logs)
		}
		calls := oldNet.calls.Load()
		for i := range 5 {
			time.Sleep(time.Second)
			older.Reserve(t.Context(), "d"+string(rune('0'+i)), lim, one)
		}
		if n := oldNet.calls.Load() - calls; n != 0 {
			t.Errorf("older spender made %d calls after the duplicate was found; want none (no epoch ping-pong)", n)
		}

		// The newer one keeps its id: answered from the allocator, ready.
		for i := range 5 {
			r, err := newer.Reserve(t.Context(), "e"+string(rune('0'+i)), lim, one)
			if err != nil || spender.AdmissionPath(r) == spender.PathFallback {
				t.Fatalf("newer spender: %v; want admitted from a lease", err)
			}
		}
		if err := newer.Ready(); err != nil {
			t.Errorf("newer Ready: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := older.Close(ctx); !errors.Is(err, spender.ErrDuplicateSpender) {
			t.Errorf("older Close: %v; want ErrDuplicateSpender", err)
		}
		if err := newer.Close(ctx); err != nil {
			t.Errorf("newer Close: %v", err)
		}
	})
}

// TestRestartBelowAnOlderEpochTakesOver: a restarted spender whose epoch is
// below the one the allocator last saw for its id (its clock went back)
// had no call answered yet, so the refusal means a dead predecessor: it
// starts an epoch above the allocator's and goes on, once, without error.
func TestRestartBelowAnOlderEpochTakesOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clk bubbleClock
		alloc := newAllocator(t, clk)
		lim := ration.Limits{RPM: 600, TPM: 600_000}
		one := ration.Amount{Requests: 1, Tokens: 100}
		// An epoch an hour past the clock, in ns since the Unix epoch (a
		// day past it would be refused: TestEpochAheadStopsTheSpender).
		dead := newLimiter(t, clk, spender.WithLeases(alloc), spender.WithSpenderID("gw"),
			spender.WithEpoch(uint64(clk.Now().Add(time.Hour).UnixNano())), testTuning(time.Second))
		if _, err := dead.Reserve(t.Context(), "a", lim, one); err != nil {
			t.Fatal(err)
		}
		// dead crashed: it is only stopped at the end (its Release is then
		// refused). Its successor's epoch is lower.
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			dead.Close(ctx)
		}()
		logs := &testkit.SyncBuffer{}
		l := newLimiter(t, clk, spender.WithLeases(alloc), spender.WithSpenderID("gw"), spender.WithEpoch(1000), testTuning(time.Second), spender.WithLogger(testLogger(logs)))
		for i := range 3 {
			r, err := l.Reserve(t.Context(), "k"+string(rune('0'+i)), lim, one)
			if err != nil || spender.AdmissionPath(r) == spender.PathFallback {
				t.Fatalf("request %d after the restart: %v; want admitted from a lease", i, err)
			}
		}
		if err := l.Ready(); err != nil {
			t.Errorf("Ready: %v", err)
		}
		if strings.Contains(logs.String(), "level=ERROR") {
			t.Errorf("a restart logged an error:\n%s", logs)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}

// testLogger logs text lines, every level, to w.
func testLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// TestEpochAheadStopsTheSpender: a spender whose epoch is more than a day
// past the allocator's clock is refused with the field caller.epoch; it
// stops calling (rather than asking again at once, for ever), answers
// from its fallback policy (its share's bucket starts empty: a 429 at
// first) and reports ErrSpenderRefused from Ready.
func TestEpochAheadStopsTheSpender(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clk bubbleClock
		alloc := newAllocator(t, clk)
		logs := &testkit.SyncBuffer{}
		l := newLimiter(t, clk, spender.WithLeases(alloc), spender.WithSpenderID("gw"), testTuning(time.Second),
			spender.WithEpoch(uint64(clk.Now().Add(48*time.Hour).UnixNano())), spender.WithLogger(testLogger(logs)))
		lim := ration.Limits{RPM: 600}
		for i := range 3 {
			r, err := l.Reserve(t.Context(), "k", lim, ration.Amount{Requests: 1})
			if err == nil && spender.AdmissionPath(r) != spender.PathFallback || err != nil && !errors.Is(err, spender.ErrRateLimited) {
				t.Fatalf("request %d: %v, want the fallback policy's answer", i, err)
			}
			clk.Advance(time.Second)
		}
		if err := l.Ready(); !errors.Is(err, spender.ErrSpenderRefused) {
			t.Fatalf("Ready = %v, want ErrSpenderRefused", err)
		}
		if n := strings.Count(logs.String(), "refuses our epoch"); n != 1 {
			t.Fatalf("%d refusals logged, want 1:\n%s", n, logs)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := l.Close(ctx); !errors.Is(err, spender.ErrSpenderRefused) {
			t.Errorf("Close = %v, want ErrSpenderRefused", err)
		}
	})
}
