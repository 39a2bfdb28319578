package ledger

import (
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// A snapshot recomputed for a retried reply refills the bucket only at the
// rate the shares leave it, as the key itself does.
func TestSnapshotAtCountsShares(t *testing.T) {
	s, err := New(Config{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lim := ration.Limits{RPM: 600}
	now := bucket.Instant(1_800_000_000_000_000)
	apply := func(cmd Command) *AcquireReply {
		r, _, err := s.Apply(cmd)
		if err != nil {
			t.Fatal(err)
		}
		return r.(*AcquireReply)
	}
	apply(Acquire{Now: now, Caller: Caller{SpenderID: "a", Epoch: 1, Sequence: 1},
		Keys: []AcquireKey{{Key: "k", Limits: lim, Want: ration.Amount{Requests: 600}, Need: ration.Amount{Requests: 600}}}})
	r := apply(Acquire{Now: now, Caller: Caller{SpenderID: "b", Epoch: 1, Sequence: 1},
		Keys: []AcquireKey{{Key: "k", Limits: lim, Demand: ration.Amount{Requests: 6000}}}})
	if r.Keys[0].Share.Requests != ration.ShareUnit {
		t.Fatalf("share %+v, want the whole rate", r.Keys[0].Share)
	}
	if got := s.snapshotAt("k", lim, now.Add(5*time.Second)).Requests.Remaining; got != 0 {
		t.Fatalf("snapshot 5 s later: %d remaining under a share of the whole rate, want 0", got)
	}
}

// ledgerRig applies commands to a State on TTL ttl, failing the test on
// an error, with each spender's sequence counted for it.
type ledgerRig struct {
	t   *testing.T
	s   *State
	now bucket.Instant
	seq map[string]uint64
}

func newLedgerRig(t *testing.T, ttl time.Duration) *ledgerRig {
	t.Helper()
	s, err := New(Config{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return &ledgerRig{t: t, s: s, now: 1_800_000_000_000_000, seq: map[string]uint64{}}
}

// acquire applies an Acquire of k by spender at the rig's now.
func (g *ledgerRig) acquire(spender string, k AcquireKey) AcquireResult {
	g.t.Helper()
	g.seq[spender]++
	r, _, err := g.s.Apply(Acquire{Now: g.now, Caller: Caller{SpenderID: spender, Epoch: 1, Sequence: g.seq[spender]}, Keys: []AcquireKey{k}})
	if err != nil {
		g.t.Fatal(err)
	}
	return r.(*AcquireReply).Keys[0]
}

// A NOT_COVERED answer names the exact wait at the rate the shares leave
// the bucket, however long: a spender passes it on to its clients as
// their Retry-After (it asks again sooner itself, at its renewal).
func TestNotCoveredWaitIsExactUnderShares(t *testing.T) {
	g := newLedgerRig(t, 10*time.Second)
	lim := ration.Limits{RPM: 600} // 10 a second
	g.acquire("a", AcquireKey{Key: "k", Limits: lim, Want: ration.Amount{Requests: 600}, Need: ration.Amount{Requests: 600}})
	r := g.acquire("a", AcquireKey{Key: "k", Limits: lim, Held: ration.Amount{Requests: 600}, Demand: ration.Amount{Requests: 480}})
	if r.Share.Requests == 0 || r.Share.Requests == ration.ShareUnit {
		t.Fatalf("share %+v, want part of the rate (a demand of 8 a second)", r.Share)
	}
	free := ration.ShareUnit - r.Share.Requests
	// b needs 100: at the free part of 10 a second.
	r = g.acquire("b", AcquireKey{Key: "k", Limits: lim, Want: ration.Amount{Requests: 100}, Need: ration.Amount{Requests: 100}})
	want := time.Duration(100 * float64(time.Second) / (10 * float64(free) / ration.ShareUnit))
	if r.Status != StatusNotCovered || r.RetryAfter < want-time.Millisecond || r.RetryAfter > want+time.Millisecond {
		t.Fatalf("b: %v after %v, want NOT_COVERED after %v (100 at %d ppm of 10 a second), not capped at half a TTL",
			r.Status, r.RetryAfter, want, free)
	}
}

// No share is granted on a key whose whole refill would not accrue a
// request in a renewal period (half a TTL): a 3 RPM key on a 10 s TTL
// accrues a quarter of a request in 5 s, and refill split that way would
// sit in fractions at every gateway. Such a key is served from its bucket,
// with exact waits; one ten times faster gets its share.
func TestNoShareBelowARequestPerRenewal(t *testing.T) {
	for _, tc := range []struct {
		lim   ration.Limits
		share bool
	}{
		{ration.Limits{RPM: 3, TPM: 1000}, false},
		{ration.Limits{RPM: 5, Window: 24 * time.Hour}, false},
		{ration.Limits{RPM: 30, TPM: 1000}, true},
		{ration.Limits{TPM: 1000}, true}, // no request dimension: tokens alone say nothing of a request
	} {
		g := newLedgerRig(t, 10*time.Second)
		c := tc.lim.Capacity()
		g.acquire("a", AcquireKey{Key: "k", Limits: tc.lim, Want: c, Need: c})
		r := g.acquire("a", AcquireKey{Key: "k", Limits: tc.lim, Held: c, Demand: ration.Amount{Requests: 1000, Tokens: 100_000}.Min(tc.lim.Limited(ration.Amount{Requests: 1000, Tokens: 100_000}))})
		if got := !r.Share.Zero(); got != tc.share {
			t.Errorf("%+v: share %+v (fair %+v, burst %+v), want a share: %v", tc.lim, r.Share, r.ShareFair, r.ShareBurst, tc.share)
		}
		if !tc.share && (!r.ShareFair.Zero() || r.ShareBurst != (ration.Amount{})) {
			t.Errorf("%+v: no share, but fair %+v and burst %+v: the spender would renew early for it", tc.lim, r.ShareFair, r.ShareBurst)
		}
	}
}

// A spender that gives a key back (holds nothing after the call, asks for
// nothing, no share either) is no longer one of its holders: the key's
// holdings and active spenders drop at once. One that asks for a share, or
// holds anything, stays.
func TestGivenBackHoldingGoes(t *testing.T) {
	g := newLedgerRig(t, 10*time.Second)
	lim := ration.Limits{RPM: 600}
	g.acquire("a", AcquireKey{Key: "k", Limits: lim, Want: ration.Amount{Requests: 10}, Need: ration.Amount{Requests: 1}})
	g.acquire("b", AcquireKey{Key: "k", Limits: lim, Want: ration.Amount{Requests: 10}, Need: ration.Amount{Requests: 1}})
	if st := g.s.Stats(); st.Holdings != 2 {
		t.Fatalf("%d holdings, want 2", st.Holdings)
	}
	// b still wants a share: it stays, holding nothing.
	r := g.acquire("b", AcquireKey{Key: "k", Limits: lim, Returned: ration.Amount{Requests: 10}, Demand: ration.Amount{Requests: 60}})
	if r.ActiveSpenders != 2 || g.s.Stats().Holdings != 2 {
		t.Fatalf("b with a demand: %d active, %d holdings; want both kept", r.ActiveSpenders, g.s.Stats().Holdings)
	}
	// a gives everything back and asks for nothing: gone.
	r = g.acquire("a", AcquireKey{Key: "k", Limits: lim, Returned: ration.Amount{Requests: 10}})
	if r.Returned.Requests != 10 || r.Held != (ration.Amount{}) {
		t.Fatalf("a's give-back: returned %+v, held %+v; want 10 back and nothing held", r.Returned, r.Held)
	}
	if st := g.s.Stats(); st.Holdings != 1 {
		t.Fatalf("%d holdings after a gave the key back, want 1 (b's)", st.Holdings)
	}
	r = g.acquire("b", AcquireKey{Key: "k", Limits: lim})
	if st := g.s.Stats(); st.Holdings != 0 || r.ActiveSpenders != 1 {
		t.Fatalf("after b too: %d holdings (answer counted %d active), want none", st.Holdings, r.ActiveSpenders)
	}
	if r.Snapshot.Requests.Remaining != 600 {
		t.Fatalf("the bucket holds %d, want 600 (everything granted came back)", r.Snapshot.Requests.Remaining)
	}
}

// The cap burns exactly what exceeds it, in the bucket's units: a per-day
// key whose holdings and level reach the cap by a few seconds' refill
// loses those seconds, not a whole request (4.8 hours of a 5-a-day key's
// refill, which put it a request behind the wait it had named).
func TestCapBurnsExactly(t *testing.T) {
	g := newLedgerRig(t, 10*time.Second)
	lim := ration.Limits{RPM: 5, Window: 24 * time.Hour}
	one := ration.Amount{Requests: 1}
	g.acquire("a", AcquireKey{Key: "k", Limits: lim, Want: one, Need: one})
	g.now = g.now.Add(time.Second)
	g.acquire("b", AcquireKey{Key: "k", Limits: lim, Want: one, Need: one})
	g.now = g.now.Add(time.Second)
	g.acquire("a", AcquireKey{Key: "k", Limits: lim, Held: one}) // a's holding now outlives the cap's room
	// Level 3 and holdings of 2 reach the cap C + ρ·TTL a second before
	// b's holding expires; then the bucket refills for 5 hours.
	g.now = g.now.Add(5 * time.Hour)
	r := g.acquire("p", AcquireKey{Key: "k", Limits: lim})
	if r.Snapshot.Requests.Remaining != 4 {
		t.Fatalf("after 5 hours %d remaining, want 4 (3 and 5 hours of 5 a day, less a few seconds burned at the cap)", r.Snapshot.Requests.Remaining)
	}
	// Full again when the rest of the fifth request has refilled: 4.8 h
	// less the 5 h's part beyond the fourth, 4 h 36 min.
	if got, want := r.Snapshot.Requests.Reset, 4*time.Hour+36*time.Minute; got < want-time.Minute || got > want+time.Minute {
		t.Fatalf("full again in %v, want about %v", got, want)
	}
}
