package allocator

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/bucket"
)

var ctx = context.Background()

func TestAcquireGrantsFromFullBucket(t *testing.T) {
	clk := newFakeClock()
	l := newLedger(t, clk)
	r := acq(t, l, caller("a", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 1, Tokens: 100}, Held: ration.Amount{}})
	want := ledger.AcquireResult{
		Status: ledger.StatusOK, Granted: ration.Amount{Requests: 1, Tokens: 100}, Held: ration.Amount{Requests: 1, Tokens: 100},
		Snapshot: ledger.Snapshot{
			Requests: ledger.DimSnapshot{Limit: 600, Remaining: 599, Reset: 100 * time.Millisecond},
			Tokens:   ledger.DimSnapshot{Limit: 600, Remaining: 500, Reset: 10 * time.Second},
		},
		ActiveSpenders: 1,
	}
	if r != want {
		t.Fatalf("got %+v\nwant %+v", r, want)
	}
}

func TestNotCoveredGivesExactRetryAfter(t *testing.T) {
	clk := newFakeClock()
	l := newLedger(t, clk)
	acq(t, l, caller("a", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 600}})
	r := acq(t, l, caller("b", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 100}, Need: ration.Amount{Requests: 1, Tokens: 60}})
	if r.Status != ledger.StatusNotCovered || r.RetryAfter != 6*time.Second || r.Granted != (ration.Amount{}) {
		t.Fatalf("got %+v, want not covered, retry after 6s, nothing granted", r)
	}
	if r.ActiveSpenders != 2 {
		t.Fatalf("active spenders %d, want 2", r.ActiveSpenders)
	}
	clk.Advance(6 * time.Second)
	r = acq(t, l, caller("b", 1, 2), ledger.AcquireKey{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 100}, Need: ration.Amount{Requests: 1, Tokens: 60}})
	if r.Status != ledger.StatusOK || r.Granted.Tokens != 60 {
		t.Fatalf("after the wait: %+v, want 60 tokens granted", r)
	}
}

func TestNeedAboveCapacityIsTooLarge(t *testing.T) {
	l := newLedger(t, newFakeClock())
	r := acq(t, l, caller("a", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Need: ration.Amount{Requests: 1, Tokens: 601}, Want: ration.Amount{Requests: 1, Tokens: 601}})
	if r.Status != ledger.StatusTooLarge || r.Granted != (ration.Amount{}) || r.Snapshot.Tokens.Remaining != 600 {
		t.Fatalf("got %+v, want too large and nothing taken", r)
	}
}

func TestReturnsAreCappedAtHoldings(t *testing.T) {
	clk := newFakeClock()
	l := newLedger(t, clk)
	acq(t, l, caller("a", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 100}, Held: ration.Amount{}})
	acq(t, l, caller("b", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 300}})
	// a claims to return 1000 tokens; it holds 100.
	r := acq(t, l, caller("a", 1, 2), ledger.AcquireKey{Key: "k", Limits: tpm(600), Returned: ration.Amount{Requests: 5, Tokens: 1000}, Held: ration.Amount{Requests: 0, Tokens: 0}})
	if r.Returned != (ration.Amount{Requests: 0, Tokens: 100}) || r.Held != (ration.Amount{}) {
		t.Fatalf("got returned %+v held %+v, want 100 tokens credited and nothing held", r.Returned, r.Held)
	}
	if r.Snapshot.Tokens.Remaining != 300 {
		t.Fatalf("remaining %d, want 300 (600 - 300 held by b)", r.Snapshot.Tokens.Remaining)
	}
	// A spender that never held anything gets nothing credited.
	r = acq(t, l, caller("c", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Returned: ration.Amount{Requests: 0, Tokens: 50}})
	if r.Returned != (ration.Amount{}) || r.Snapshot.Tokens.Remaining != 300 {
		t.Fatalf("stranger's return credited: %+v", r)
	}
}

func TestHeldReportLowersHolding(t *testing.T) {
	l := newLedger(t, newFakeClock())
	acq(t, l, caller("a", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 100}})
	r := acq(t, l, caller("a", 1, 2), ledger.AcquireKey{Key: "k", Limits: tpm(600), Held: ration.Amount{Requests: 0, Tokens: 30}})
	if r.Held != (ration.Amount{Requests: 0, Tokens: 30}) {
		t.Fatalf("held %+v, want 30 tokens", r.Held)
	}
	// A held report above the holding does not raise it.
	r = acq(t, l, caller("a", 1, 3), ledger.AcquireKey{Key: "k", Limits: tpm(600), Held: ration.Amount{Requests: 0, Tokens: 500}, Returned: ration.Amount{Requests: 0, Tokens: 500}})
	if r.Held != (ration.Amount{}) || r.Returned != (ration.Amount{Requests: 0, Tokens: 30}) {
		t.Fatalf("held %+v returned %+v, want 0 held, 30 credited", r.Held, r.Returned)
	}
}

func TestExactlyOnce(t *testing.T) {
	clk := newFakeClock()
	l := newLedger(t, clk)
	k := []ledger.AcquireKey{{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 1, Tokens: 100}}}
	r1, err := l.Acquire(ctx, caller("a", 1, 5), k)
	if err != nil {
		t.Fatal(err)
	}
	before := dump(l)
	clk.Advance(time.Second)
	r2, err := l.Acquire(ctx, caller("a", 1, 5), k)
	if err != nil || r2 == r1 || fmt.Sprint(*r2) != fmt.Sprint(*r1) {
		t.Fatalf("retry: %v, reply %+v want a copy of the stored %+v", err, r2, r1)
	}
	if dump(l) != before {
		t.Fatal("retry changed the ledger")
	}
	other := []ledger.AcquireKey{{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 1, Tokens: 101}}}
	_, err = l.Acquire(ctx, caller("a", 1, 5), other)
	wantErr(t, err, ledger.ErrSequenceReused)
	_, err = l.ReserveAhead(ctx, caller("a", 1, 5), []ledger.ReserveKey{{Key: "k", Limits: tpm(600)}})
	wantErr(t, err, ledger.ErrSequenceReused)
	_, err = l.Acquire(ctx, caller("a", 1, 4), k)
	wantErr(t, err, ledger.ErrStaleSequence)
	_, err = l.Acquire(ctx, caller("a", 0+1-1+0, 9), k) // epoch 0 is bad input, not stale
	wantErr(t, err, ledger.ErrInvalidArgument)
	if dump(l) != before {
		t.Fatal("refused calls changed the ledger")
	}
	// Gaps are allowed.
	if _, err := l.Acquire(ctx, caller("a", 1, 9), k); err != nil {
		t.Fatal(err)
	}
}

func TestNewEpochStartsWithNothing(t *testing.T) {
	clk := newFakeClock()
	l := newLedger(t, clk)
	acq(t, l, caller("a", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 100}})
	r := acq(t, l, caller("a", 2, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Returned: ration.Amount{Requests: 0, Tokens: 100}})
	if r.Returned != (ration.Amount{}) || r.Held != (ration.Amount{}) {
		t.Fatalf("new epoch: returned %+v held %+v, want nothing", r.Returned, r.Held)
	}
	if r.ActiveSpenders != 2 || r.Snapshot.Tokens.Remaining != 500 {
		t.Fatalf("old epoch's lease must still count: %+v", r)
	}
	_, err := l.Acquire(ctx, caller("a", 1, 2), []ledger.AcquireKey{{Key: "k", Limits: tpm(600)}})
	wantErr(t, err, ledger.ErrStaleEpoch)
	clk.Advance(l.TTL())
	r = acq(t, l, caller("a", 2, 2), ledger.AcquireKey{Key: "k", Limits: tpm(600)})
	if r.ActiveSpenders != 1 {
		t.Fatalf("old epoch's lease should have expired: %+v", r)
	}
}

func TestRelease(t *testing.T) {
	clk := newFakeClock()
	l := newLedger(t, clk)
	acq(t, l, caller("a", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 100}})
	acq(t, l, caller("a", 1, 2), ledger.AcquireKey{Key: "j", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 200}})
	rel := []ledger.ReleaseKey{{Key: "k", Limits: tpm(600), Returned: ration.Amount{Requests: 0, Tokens: 70}, Debt: ration.Amount{Requests: 0, Tokens: 10}}}
	r, err := l.Release(ctx, caller("a", 1, 3), rel)
	if err != nil {
		t.Fatal(err)
	}
	if r.Returned[0] != (ration.Amount{Requests: 0, Tokens: 70}) {
		t.Fatalf("credited %+v, want 70 tokens", r.Returned[0])
	}
	if st := l.Stats(); st.Holdings != 0 {
		t.Fatalf("holdings after release: %+v", st)
	}
	r2, err := l.Release(ctx, caller("a", 1, 3), rel)
	if err != nil || fmt.Sprint(r2) != fmt.Sprint(r) {
		t.Fatalf("retried release: %+v %v, want the stored %+v", r2, err, r)
	}
	_, err = l.Acquire(ctx, caller("a", 1, 4), []ledger.AcquireKey{{Key: "k", Limits: tpm(600)}})
	wantErr(t, err, ledger.ErrEpochReleased)
	res := acq(t, l, caller("b", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600)})
	// 600 - 100 + 70 - 10 = 560; the 30 unreturned are gone.
	if res.Snapshot.Tokens.Remaining != 560 {
		t.Fatalf("remaining %d, want 560", res.Snapshot.Tokens.Remaining)
	}
}

func TestDebtGoesBelowZero(t *testing.T) {
	l := newLedger(t, newFakeClock())
	acq(t, l, caller("a", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Debt: ration.Amount{Requests: 0, Tokens: 1000}})
	r := acq(t, l, caller("a", 1, 2), ledger.AcquireKey{Key: "k", Limits: tpm(600), Need: ration.Amount{Requests: 0, Tokens: 1}, Want: ration.Amount{Requests: 0, Tokens: 1}})
	// level -400: one token needs 401 tokens of refill at 10/s.
	if r.Status != ledger.StatusNotCovered || r.RetryAfter != 40100*time.Millisecond || r.Snapshot.Tokens.Remaining != 0 {
		t.Fatalf("got %+v, want not covered for 40.1s", r)
	}
}

func TestReserveAhead(t *testing.T) {
	clk := newFakeClock()
	l := newLedger(t, clk)
	acq(t, l, caller("a", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 600}})
	res, err := l.ReserveAhead(ctx, caller("b", 1, 1), []ledger.ReserveKey{
		{Key: "k", Limits: tpm(600), Cost: ration.Amount{Requests: 1, Tokens: 50}, MaxWait: 10 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	if r := res.Keys[0]; r.Status != ledger.StatusOK || r.Wait != 5*time.Second || r.Held != (ration.Amount{Requests: 1, Tokens: 50}) {
		t.Fatalf("got %+v, want reserved for 5s", r)
	}
	res, err = l.ReserveAhead(ctx, caller("c", 1, 1), []ledger.ReserveKey{
		{Key: "k", Limits: tpm(600), Cost: ration.Amount{Requests: 1, Tokens: 100}, MaxWait: 14 * time.Second},
		{Key: "k2", Limits: tpm(600), Cost: ration.Amount{Requests: 1, Tokens: 601}, MaxWait: time.Hour},
	})
	if err != nil {
		t.Fatal(err)
	}
	// The first reservation left -50: 100 more need 150 tokens, 15 s.
	if r := res.Keys[0]; r.Status != ledger.StatusTooLate || r.Wait != 15*time.Second || r.Held != (ration.Amount{}) || r.ActiveSpenders != 2 {
		t.Fatalf("got %+v, want too late by 15s, nothing held, 2 active", r)
	}
	if r := res.Keys[1]; r.Status != ledger.StatusTooLarge {
		t.Fatalf("got %+v, want too large", r)
	}
	clk.Advance(5 * time.Second)
	r := acq(t, l, caller("d", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Need: ration.Amount{Requests: 0, Tokens: 1}})
	if r.Status != ledger.StatusNotCovered || r.RetryAfter != 100*time.Millisecond {
		t.Fatalf("after the reserved wait the level is 0: %+v", r)
	}
}

func TestLimitChangeDoesNotMint(t *testing.T) {
	clk := newFakeClock()
	l := newLedger(t, clk)
	acq(t, l, caller("a", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 600}})
	r := acq(t, l, caller("b", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(1200)})
	if r.Snapshot.Tokens.Remaining != 0 || r.Snapshot.Tokens.Limit != 1200 {
		t.Fatalf("raised limit minted tokens: %+v", r.Snapshot.Tokens)
	}
	clk.Advance(time.Second)
	r = acq(t, l, caller("b", 1, 2), ledger.AcquireKey{Key: "k", Limits: tpm(1200)})
	if r.Snapshot.Tokens.Remaining != 20 {
		t.Fatalf("refill at the new rate: %+v, want 20", r.Snapshot.Tokens)
	}
	r = acq(t, l, caller("b", 1, 3), ledger.AcquireKey{Key: "k", Limits: ration.Limits{RPM: 600}, Want: ration.Amount{Requests: 0, Tokens: 12345}})
	if r.Granted.Tokens != 12345 || r.Snapshot.Tokens != (ledger.DimSnapshot{}) {
		t.Fatalf("unlimited tokens: %+v", r)
	}
}

func TestUnlimitedKeyKeepsNoState(t *testing.T) {
	l := newLedger(t, newFakeClock())
	r := acq(t, l, caller("a", 1, 1), ledger.AcquireKey{Key: "k", Want: ration.Amount{Requests: 7, Tokens: 9}})
	if r.Status != ledger.StatusOK || r.Granted != (ration.Amount{Requests: 7, Tokens: 9}) || r.Held != (ration.Amount{}) {
		t.Fatalf("got %+v", r)
	}
	if st := l.Stats(); st.Keys != 0 {
		t.Fatalf("unlimited key stored: %+v", st)
	}
}

// TestReturnedTokensDoNotAccumulate replays the hoarding pattern that a
// plain "grants follow the bucket, returns go back" ledger gets wrong: two
// spenders keep returning their lease just before it expires and being
// granted it again, while the bucket refills behind them. Without the cap
// on level + holdings their holdings grow by rho every second, without
// bound; with it they never exceed C + rho*TTL (C in strict mode).
func TestReturnedTokensDoNotAccumulate(t *testing.T) {
	for _, strict := range []bool{false, true} {
		clk := newFakeClock()
		ttl := 100 * time.Second
		l := newLedger(t, clk, WithTTL(ttl), WithStrict(strict))
		lim := ration.Limits{TPM: 60} // C = 60, rho = 1/s
		capK := int64(60 + 100)
		if strict {
			capK = 60
		}
		held := map[string]int64{}
		seq := map[string]uint64{}
		for round := 0; round < 40; round++ {
			for _, who := range []string{"a", "b"} {
				// Take whatever the bucket has, keeping the old lease...
				old := held[who]
				seq[who]++
				r := acq(t, l, caller(who, 1, seq[who]), ledger.AcquireKey{
					Key: "k", Limits: lim, Want: ration.Amount{Requests: 0, Tokens: 1 << 40}, Held: ration.Amount{Requests: 0, Tokens: old},
				})
				fresh := r.Granted.Tokens
				// ...then return the old lease into the emptied bucket and
				// take it again with a fresh expiry.
				seq[who]++
				r = acq(t, l, caller(who, 1, seq[who]), ledger.AcquireKey{
					Key: "k", Limits: lim, Want: ration.Amount{Requests: 0, Tokens: 1 << 40},
					Returned: ration.Amount{Requests: 0, Tokens: old}, Held: ration.Amount{Requests: 0, Tokens: fresh},
				})
				held[who] = fresh + r.Granted.Tokens
				if total := held["a"] + held["b"] + r.Snapshot.Tokens.Remaining; total > capK {
					t.Fatalf("strict=%v round %d: level+holdings %d > %d", strict, round, total, capK)
				}
				clk.Advance(30 * time.Second)
			}
		}
	}
}

func TestStrictModeCountsHoldingsAgainstCapacity(t *testing.T) {
	for _, tc := range []struct {
		strict bool
		want   int64 // remaining after 30 s; the 600 held expired at 10 s
	}{
		// Until 10 s the cap holds level+held at 700 (level 100); then the
		// holding expires and 20 s of refill add 200.
		{false, 300},
		// Strict: the cap is 600, so the level stays 0 until the holding
		// expires at 10 s; then 20 s of refill add 200.
		{true, 200},
	} {
		clk := newFakeClock()
		l := newLedger(t, clk, WithStrict(tc.strict))
		acq(t, l, caller("a", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 600}})
		clk.Advance(30 * time.Second)
		r := acq(t, l, caller("b", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600)})
		if r.Snapshot.Tokens.Remaining != tc.want {
			t.Fatalf("strict=%v: remaining %d, want %d", tc.strict, r.Snapshot.Tokens.Remaining, tc.want)
		}
	}
}

func TestSweepDropsIdleKeysAndSessions(t *testing.T) {
	clk := newFakeClock()
	l := newLedger(t, clk, WithSessionRetention(time.Minute))
	acq(t, l, caller("a", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 300}})
	if k, s, err := l.Sweep(ctx); err != nil || k != 0 || s != 0 {
		t.Fatalf("sweep of a busy key: %d %d %v", k, s, err)
	}
	clk.Advance(l.TTL()) // lease expired, bucket at 400
	if k, _, _ := l.Sweep(ctx); k != 0 {
		t.Fatal("dropped a key whose bucket is not full")
	}
	clk.Advance(20 * time.Second) // full
	if k, _, _ := l.Sweep(ctx); k != 1 {
		t.Fatal("kept an idle key")
	}
	clk.Advance(time.Minute)
	if _, s, _ := l.Sweep(ctx); s != 1 {
		t.Fatal("kept an idle session")
	}
	if st := l.Stats(); st != (ledger.Stats{}) {
		t.Fatalf("stats after sweep: %+v", st)
	}
	r := acq(t, l, caller("a", 2, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600)})
	if r.Snapshot.Tokens.Remaining != 600 {
		t.Fatalf("recreated key not full: %+v", r.Snapshot.Tokens)
	}
}

func TestLostSessionDoesNotReapplyKeys(t *testing.T) {
	l := newLedger(t, newFakeClock())
	k := []ledger.AcquireKey{{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 100}}}
	if _, err := l.Acquire(ctx, caller("a", 1, 1), k); err != nil {
		t.Fatal(err)
	}
	m := memoryOf(l)
	m.mu.Lock()
	m.state.Load(ledger.Record{Session: true, Name: "a"}, 0) // deletes a's session
	m.mu.Unlock()
	r, err := l.Acquire(ctx, caller("a", 1, 1), k)
	if err != nil {
		t.Fatal(err)
	}
	if g := r.Keys[0]; g.Granted != (ration.Amount{}) || g.Held != (ration.Amount{Requests: 0, Tokens: 100}) || g.Snapshot.Tokens.Remaining != 500 {
		t.Fatalf("reapplied: %+v", g)
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	clk := newFakeClock()
	l := newLedger(t, clk)
	acq(t, l, caller("a", 1, 1), ledger.AcquireKey{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 100}})
	before := dump(l)
	good := func() ledger.AcquireKey {
		return ledger.AcquireKey{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 1}}
	}
	many := make([]ledger.AcquireKey, ration.MaxBatch+1)
	for i := range many {
		many[i] = good()
		many[i].Key = "k" + strconv.Itoa(i)
	}
	for _, tc := range []struct {
		name  string
		c     ledger.Caller
		keys  []ledger.AcquireKey
		field string
	}{
		{"empty spender", caller("", 1, 2), []ledger.AcquireKey{good()}, "caller.spender_id"},
		{"long spender", caller(strings.Repeat("s", ration.MaxSpenderIDLen+1), 1, 2), []ledger.AcquireKey{good()}, "caller.spender_id"},
		{"zero epoch", caller("a", 0, 2), []ledger.AcquireKey{good()}, "caller.epoch"},
		{"zero sequence", caller("a", 1, 0), []ledger.AcquireKey{good()}, "caller.sequence"},
		{"empty batch", caller("a", 1, 2), nil, "keys"},
		{"batch too large", caller("a", 1, 2), many, "keys"},
		{"empty key", caller("a", 1, 2), []ledger.AcquireKey{good(), {Limits: tpm(600)}}, "keys[1].key"},
		{"long key", caller("a", 1, 2), []ledger.AcquireKey{{Key: strings.Repeat("k", ration.MaxKeyLen+1), Limits: tpm(600)}}, "keys[0].key"},
		{"duplicate key", caller("a", 1, 2), []ledger.AcquireKey{good(), good()}, "keys[1].key"},
		{"negative want", caller("a", 1, 2), []ledger.AcquireKey{{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: -1}}}, "keys[0].want.tokens"},
		{"negative need", caller("a", 1, 2), []ledger.AcquireKey{{Key: "k", Limits: tpm(600), Need: ration.Amount{Requests: -1, Tokens: 0}}}, "keys[0].need.requests"},
		{"negative returned", caller("a", 1, 2), []ledger.AcquireKey{{Key: "k", Limits: tpm(600), Returned: ration.Amount{Requests: 0, Tokens: -5}}}, "keys[0].returned.tokens"},
		{"negative held", caller("a", 1, 2), []ledger.AcquireKey{{Key: "k", Limits: tpm(600), Held: ration.Amount{Requests: 0, Tokens: -5}}}, "keys[0].held.tokens"},
		{"negative debt", caller("a", 1, 2), []ledger.AcquireKey{{Key: "k", Limits: tpm(600), Debt: ration.Amount{Requests: 0, Tokens: -5}}}, "keys[0].debt.tokens"},
		{"negative rate", caller("a", 1, 2), []ledger.AcquireKey{{Key: "k", Limits: tpm(600), SpendRate: ration.Amount{Requests: 0, Tokens: -5}}}, "keys[0].spend_rate.tokens"},
		{"huge amount", caller("a", 1, 2), []ledger.AcquireKey{{Key: "k", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 1 << 62}}}, "keys[0].want.tokens"},
		{"negative rpm", caller("a", 1, 2), []ledger.AcquireKey{{Key: "k", Limits: ration.Limits{RPM: -1}}}, "keys[0].limits.rpm"},
		{"tpm too large", caller("a", 1, 2), []ledger.AcquireKey{{Key: "k", Limits: ration.Limits{TPM: ration.MaxRate + 1}}}, "keys[0].limits.tpm"},
		{"negative burst", caller("a", 1, 2), []ledger.AcquireKey{{Key: "k", Limits: ration.Limits{TPM: 5, BurstTokens: -1}}}, "keys[0].limits.burst_tokens"},
		{"window too long", caller("a", 1, 2), []ledger.AcquireKey{{Key: "k", Limits: ration.Limits{TPM: 5, Window: ration.MaxWindow + time.Second}}}, "keys[0].limits.window"},
		{"window not whole seconds", caller("a", 1, 2), []ledger.AcquireKey{{Key: "k", Limits: ration.Limits{TPM: 5, Window: 1500 * time.Millisecond}}}, "keys[0].limits.window"},
	} {
		_, err := l.Acquire(ctx, tc.c, tc.keys)
		var ie *ledger.InputError
		if !errors.As(err, &ie) || !errors.Is(err, ledger.ErrInvalidArgument) || ie.Field != tc.field {
			t.Errorf("%s: error %v, want InputError on %s", tc.name, err, tc.field)
		}
		if strings.Contains(err.Error(), strings.Repeat("k", 20)) {
			t.Errorf("%s: error echoes the key: %v", tc.name, err)
		}
		if dump(l) != before {
			t.Fatalf("%s: changed the ledger", tc.name)
		}
	}
	_, err := l.ReserveAhead(ctx, caller("a", 1, 2), []ledger.ReserveKey{{Key: "k", Limits: tpm(600), MaxWait: 2 * time.Hour}})
	if ie := (*ledger.InputError)(nil); !errors.As(err, &ie) || ie.Field != "keys[0].max_wait_us" {
		t.Errorf("max wait: %v", err)
	}
	_, err = l.ReserveAhead(ctx, caller("a", 1, 2), []ledger.ReserveKey{{Key: "k", Limits: tpm(600), Cost: ration.Amount{Requests: -1, Tokens: 0}}})
	if ie := (*ledger.InputError)(nil); !errors.As(err, &ie) || ie.Field != "keys[0].cost.requests" {
		t.Errorf("negative cost: %v", err)
	}
	_, err = l.Release(ctx, caller("a", 1, 2), []ledger.ReleaseKey{{Key: "k", Limits: tpm(600), Returned: ration.Amount{Requests: 0, Tokens: -1}}})
	if ie := (*ledger.InputError)(nil); !errors.As(err, &ie) || ie.Field != "keys[0].returned.tokens" {
		t.Errorf("negative release: %v", err)
	}
	if dump(l) != before {
		t.Fatal("changed the ledger")
	}
}

func TestDuplicateKeysInALargeBatch(t *testing.T) {
	l := newLedger(t, newFakeClock())
	for _, n := range []int{17, 64, ration.MaxBatch} {
		keys := make([]ledger.AcquireKey, n)
		for i := range keys {
			keys[i] = ledger.AcquireKey{Key: "key-" + strconv.Itoa(i), Limits: tpm(600)}
		}
		if _, err := l.Acquire(ctx, caller("a", 1, uint64(n)), keys); err != nil {
			t.Fatalf("n=%d distinct keys: %v", n, err)
		}
		keys[n-2].Key = keys[5].Key
		_, err := l.Acquire(ctx, caller("a", 1, uint64(n)+1), keys)
		var ie *ledger.InputError
		if !errors.As(err, &ie) || ie.Field != "keys["+strconv.Itoa(n-2)+"].key" || !strings.Contains(ie.Reason, "keys[5].key") {
			t.Fatalf("n=%d: %v, want keys[%d].key duplicating keys[5].key", n, err, n-2)
		}
	}
}

// TestReserveAheadWaitsForTheCap: in strict mode the level plus holdings
// stay at most C, so refill is burned while holdings fill the cap. A
// reservation that waits for refill must then also wait for holdings to
// expire, or it would be sent while the other holdings are still
// spendable: 150 sent at 0.6 s and 52 spent by A in [0.6 s, 1 s] would be
// 202 in 0.4 s, above C + rho*t = 201.3. (Found by the property test.)
func TestReserveAheadWaitsForTheCap(t *testing.T) {
	clk := newFakeClock()
	l := newLedger(t, clk, WithStrict(true), WithTTL(10*time.Second))
	lim := ration.Limits{TPM: 200} // 10 tokens every 3 s
	if g := acq(t, l, caller("a", 1, 1), ledger.AcquireKey{Key: "k", Limits: lim, Want: ration.Amount{Requests: 0, Tokens: 52}}); g.Granted.Tokens != 52 {
		t.Fatalf("granted %d, want 52", g.Granted.Tokens)
	}
	r, err := l.ReserveAhead(ctx, caller("b", 1, 1), []ledger.ReserveKey{{Key: "k", Limits: lim, Cost: ration.Amount{Requests: 0, Tokens: 150}, MaxWait: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Keys[0]; got.Status != ledger.StatusTooLate || got.Wait < 10*time.Second {
		t.Fatalf("reserve 150 beside a holding of 52 under a cap of 200: %v after %v; want TooLate, waiting past the holding's expiry", got.Status, got.Wait)
	}
	// A cost the level covers now needs no wait, cap or not.
	r, err = l.ReserveAhead(ctx, caller("b", 1, 2), []ledger.ReserveKey{{Key: "k", Limits: lim, Cost: ration.Amount{Requests: 0, Tokens: 140}, MaxWait: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Keys[0]; got.Status != ledger.StatusOK || got.Wait != 0 {
		t.Fatalf("reserve 140 that fits: %v after %v; want OK now", got.Status, got.Wait)
	}
}

// TestWaitsOnTheWireDoNotOverflow: a key deep in debt waits for years, and
// the microseconds on the wire stay positive (a negative retry_after once
// made spenders ask again in a loop).
func TestWaitsOnTheWireDoNotOverflow(t *testing.T) {
	for _, d := range []time.Duration{bucket.InfDuration, bucket.InfDuration - 1, time.Nanosecond, 0, -time.Second} {
		if got := us(d); got < 0 || (d > 0 && got == 0) {
			t.Errorf("us(%v) = %d", d, got)
		}
	}
	if us(1500*time.Nanosecond) != 2 {
		t.Errorf("us rounds up: got %d, want 2", us(1500*time.Nanosecond))
	}
}

// A key dropped (made unlimited, or swept) and recreated since a spender's
// previous call is the new state on its next call, not the old one.
func TestAcquireAfterKeyDroppedAndRecreated(t *testing.T) {
	clk := newFakeClock()
	l := newLedger(t, clk)
	keys := []ledger.AcquireKey{{Key: "k1", Limits: tpm(600), Want: ration.Amount{Requests: 1, Tokens: 100}}, {Key: "k2", Limits: tpm(600), Want: ration.Amount{Requests: 1, Tokens: 100}}}
	if _, err := l.Acquire(ctx, caller("a", 1, 1), keys); err != nil {
		t.Fatal(err)
	}
	// b makes k1 unlimited (dropped), then limited again (a new, full state).
	acq(t, l, caller("b", 1, 1), ledger.AcquireKey{Key: "k1", Want: ration.Amount{Requests: 0, Tokens: 1}})
	acq(t, l, caller("b", 1, 2), ledger.AcquireKey{Key: "k1", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 50}})
	r, err := l.Acquire(ctx, caller("a", 1, 2), keys)
	if err != nil {
		t.Fatal(err)
	}
	if k := r.Keys[0]; k.Held != (ration.Amount{Requests: 1, Tokens: 100}) || k.ActiveSpenders != 2 || k.Snapshot.Tokens.Remaining != 450 {
		t.Fatalf("k1 after it was recreated: %+v, want a fresh holding next to b's", k)
	}
	if k := r.Keys[1]; k.Held != (ration.Amount{Requests: 1, Tokens: 100}) || k.ActiveSpenders != 1 || k.Snapshot.Tokens.Remaining != 400 {
		t.Fatalf("k2: %+v", k)
	}
	// Everything expires and refills: Sweep drops both keys; c recreates k2.
	clk.Advance(time.Hour)
	if n, _, err := l.Sweep(ctx); err != nil || n != 2 {
		t.Fatalf("sweep dropped %d keys (%v), want 2", n, err)
	}
	acq(t, l, caller("c", 1, 1), ledger.AcquireKey{Key: "k2", Limits: tpm(600), Want: ration.Amount{Requests: 0, Tokens: 10}})
	r, err = l.Acquire(ctx, caller("a", 1, 3), keys)
	if err != nil {
		t.Fatal(err)
	}
	if k := r.Keys[1]; k.Held != (ration.Amount{Requests: 1, Tokens: 100}) || k.ActiveSpenders != 2 || k.Snapshot.Tokens.Remaining != 490 {
		t.Fatalf("k2 after sweep: %+v, want a fresh holding next to c's", k)
	}
	if st := l.Stats(); st.Keys != 2 {
		t.Fatalf("keys: %+v, want k1 and k2", st)
	}
}
