package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// The rules that keep one caller from changing what another is granted
// (docs/bound.md, "Rules for callers"), each checked against a caller that
// breaks it.

var t0 = InstantOf(time.Unix(1_800_000_000, 0))

func mustState(t *testing.T, cfg Config) *State {
	t.Helper()
	if cfg.TTL == 0 {
		cfg.TTL = 10 * time.Second
	}
	st, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// acquire applies an Acquire of keys for c at now.
func acquire(st *State, now bucket.Instant, c Caller, keys ...AcquireKey) (*AcquireReply, error) {
	r, _, err := st.Apply(Acquire{Now: now, Caller: c, Keys: keys})
	if err != nil {
		return nil, err
	}
	return r.(*AcquireReply), nil
}

func mustAcquire(t *testing.T, st *State, now bucket.Instant, c Caller, keys ...AcquireKey) *AcquireReply {
	t.Helper()
	r, err := acquire(st, now, c, keys...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// unchanged applies cmd, which must fail with want, and checks that the
// state is byte for byte what it was.
func unchanged(t *testing.T, st *State, cmd Command, want error) {
	t.Helper()
	before := st.Snapshot()
	_, ch, err := st.Apply(cmd)
	if !errors.Is(err, want) {
		t.Fatalf("%T = %v, want %v", cmd, err, want)
	}
	if !ch.Empty() || !bytes.Equal(before, st.Snapshot()) {
		t.Fatalf("%T refused with %v changed the state", cmd, err)
	}
}

// TestSpenderIDBelongsToItsCredential: a call under a spender id whose
// session another credential created is refused, whatever its epoch, and
// changes nothing; once the owner releases its epoch, another credential
// may start a later one under the id; a session from before credentials
// (none recorded) is adopted by the first call that names one.
func TestSpenderIDBelongsToItsCredential(t *testing.T) {
	st := mustState(t, Config{})
	lim := ration.Limits{RPM: 60}
	k := AcquireKey{Key: "k", Limits: lim, Want: ration.Amount{Requests: 10}}
	owner := Caller{SpenderID: "gw-1", Epoch: 5, Sequence: 1, Credential: "aaaa"}
	mustAcquire(t, st, t0, owner, k)
	for _, c := range []Caller{
		{SpenderID: "gw-1", Epoch: 5, Sequence: 2, Credential: "bbbb"},
		{SpenderID: "gw-1", Epoch: math.MaxUint64 / 4, Sequence: 1, Credential: "bbbb"}, // within the epoch bound at t0? no matter: refused first or as input
		{SpenderID: "gw-1", Epoch: 6, Sequence: 1, Credential: "bbbb"},
		{SpenderID: "gw-1", Epoch: 6, Sequence: 1, Credential: ""},
	} {
		if c.Epoch > maxEpoch(t0) {
			unchanged(t, st, Acquire{Now: t0, Caller: c, Keys: []AcquireKey{k}}, ErrInvalidArgument)
			continue
		}
		unchanged(t, st, Acquire{Now: t0, Caller: c, Keys: []AcquireKey{k}}, ErrForeignSpender)
		unchanged(t, st, Release{Now: t0, Caller: c}, ErrForeignSpender)
	}
	// The owner carries on.
	if r := mustAcquire(t, st, t0+1, Caller{SpenderID: "gw-1", Epoch: 5, Sequence: 2, Credential: "aaaa"}, k); r.Keys[0].Held.Requests == 0 {
		t.Fatalf("owner's holding lost: %+v", r.Keys[0])
	}
	// Released, the id may go to another credential in a later epoch.
	if _, _, err := st.Apply(Release{Now: t0 + 2, Caller: Caller{SpenderID: "gw-1", Epoch: 5, Sequence: 3, Credential: "aaaa"}}); err != nil {
		t.Fatal(err)
	}
	unchanged(t, st, Acquire{Now: t0 + 3, Caller: Caller{SpenderID: "gw-1", Epoch: 5, Sequence: 4, Credential: "bbbb"}, Keys: []AcquireKey{k}}, ErrForeignSpender)
	mustAcquire(t, st, t0+3, Caller{SpenderID: "gw-1", Epoch: 6, Sequence: 1, Credential: "bbbb"}, k)
	unchanged(t, st, Acquire{Now: t0 + 4, Caller: Caller{SpenderID: "gw-1", Epoch: 7, Sequence: 1, Credential: "aaaa"}, Keys: []AcquireKey{k}}, ErrForeignSpender)

	// A session recorded without a credential is adopted.
	old := mustState(t, Config{})
	mustAcquire(t, old, t0, Caller{SpenderID: "gw-2", Epoch: 1, Sequence: 1}, k)
	mustAcquire(t, old, t0+1, Caller{SpenderID: "gw-2", Epoch: 1, Sequence: 2, Credential: "cccc"}, k)
	unchanged(t, old, Acquire{Now: t0 + 2, Caller: Caller{SpenderID: "gw-2", Epoch: 1, Sequence: 3}, Keys: []AcquireKey{k}}, ErrForeignSpender)

	// The binding survives a restore.
	re, err := Restore(st.Config(), st.Snapshot(), t0+5)
	if err != nil {
		t.Fatal(err)
	}
	unchanged(t, re, Acquire{Now: t0 + 5, Caller: Caller{SpenderID: "gw-1", Epoch: 8, Sequence: 1, Credential: "aaaa"}, Keys: []AcquireKey{k}}, ErrForeignSpender)
}

// TestEpochWithinADayOfTheClock: an epoch more than MaxEpochAhead past the
// allocator's clock (in nanoseconds since the Unix epoch) is refused as
// input, so that no call can push a spender id's epoch where its next
// incarnation cannot follow; one at the bound is taken, and its successor,
// one above it, is taken a moment later.
func TestEpochWithinADayOfTheClock(t *testing.T) {
	st := mustState(t, Config{})
	k := AcquireKey{Key: "k", Limits: ration.Limits{RPM: 60}}
	limit := uint64(t0)*1000 + uint64(ration.MaxEpochAhead)
	for _, e := range []uint64{limit + 1, math.MaxUint64, math.MaxInt64} {
		cmd := Acquire{Now: t0, Caller: Caller{SpenderID: "gw", Epoch: e, Sequence: 1}, Keys: []AcquireKey{k}}
		unchanged(t, st, cmd, ErrInvalidArgument)
		var ie *InputError
		if _, _, err := st.Apply(cmd); !errors.As(err, &ie) || ie.Field != "caller.epoch" {
			t.Fatalf("epoch %d: %v, want an InputError on caller.epoch", e, err)
		}
		if Validate(cmd) == nil {
			t.Fatalf("Validate accepted epoch %d", e)
		}
	}
	mustAcquire(t, st, t0, Caller{SpenderID: "gw", Epoch: limit, Sequence: 1}, k)
	mustAcquire(t, st, t0+1, Caller{SpenderID: "gw", Epoch: limit + 1, Sequence: 1}, k)
}

// TestDebtStopsOnlyItsDebtorsShare: a debt is charged to the key's bucket,
// even below zero (the allocator cannot tell a true overrun from a false
// one), and while the level is below zero the holding that reported it
// gets no refill share: its part of the rate pays the debt. Every other
// holding keeps its share, so a debt of 2^50 leaves an honest spender's
// shares as they were. A lone spender's overrun is paid as before: its
// next request waits off the debt.
func TestDebtStopsOnlyItsDebtorsShare(t *testing.T) {
	lim := ration.Limits{RPM: 600, TPM: 60_000}
	honest := Caller{SpenderID: "honest", Epoch: 1, Credential: "h"}
	hostile := Caller{SpenderID: "hostile", Epoch: 1, Credential: "x"}
	call := func(c *Caller) Caller { c.Sequence++; return *c }
	demand := ration.Amount{Requests: 300, Tokens: 30_000} // half the rate
	flood := ration.Amount{Requests: ration.MaxAmount, Tokens: ration.MaxAmount}

	run := func(debt ration.Amount) (shares []ration.Share) {
		st := mustState(t, Config{})
		h, x := honest, hostile
		now := t0
		mustAcquire(t, st, now, call(&h), AcquireKey{Key: "k", Limits: lim, Want: ration.Amount{Requests: 50, Tokens: 5000}, Demand: demand})
		now += 1_000_000
		for range 5 {
			// The other spender demands the whole rate either way, and
			// reports a debt of 2^50 when attacking.
			r := mustAcquire(t, st, now, call(&x), AcquireKey{Key: "k", Limits: lim, Debt: debt, Demand: flood})
			if g := r.Keys[0]; debt != (ration.Amount{}) && (!g.Share.Zero() || g.Snapshot.Requests.Remaining != 0) {
				t.Fatalf("the debtor got %+v; want no share, the bucket empty", g)
			}
			now += 1_000_000
			// (Its status is NOT_COVERED while the level is below zero: no
			// amount is granted; its share is.)
			r = mustAcquire(t, st, now, call(&h), AcquireKey{Key: "k", Limits: lim, Demand: demand})
			shares = append(shares, r.Keys[0].Share)
			now += 2_000_000
		}
		return shares
	}
	s0, s1 := run(ration.Amount{}), run(flood)
	if fmt.Sprint(s0) != fmt.Sprint(s1) || s1[len(s1)-1].Requests < 500_000 || s1[len(s1)-1].Tokens < 500_000 {
		t.Fatalf("a debt on another holding changed the honest spender's shares %v -> %v", s0, s1)
	}

	// A lone spender: the overrun takes the level below zero, and the next
	// request waits for the refill to pay it.
	st := mustState(t, Config{})
	c := Caller{SpenderID: "solo", Epoch: 1}
	lim = ration.Limits{RPM: 60}
	mustAcquire(t, st, t0, call(&c), AcquireKey{Key: "k", Limits: lim, Want: ration.Amount{Requests: 50}})
	r := mustAcquire(t, st, t0, call(&c), AcquireKey{Key: "k", Limits: lim, Held: ration.Amount{Requests: 50}, Debt: ration.Amount{Requests: 30},
		Need: ration.Amount{Requests: 1}, Demand: ration.Amount{Requests: 60}})
	// 10 left in the bucket less 30: 20 below zero, plus the 1 needed, at 1/s.
	if g := r.Keys[0]; g.Status != StatusNotCovered || g.RetryAfter != 21*time.Second || !g.Share.Zero() {
		t.Fatalf("lone debtor: %+v, want NOT_COVERED for 21 s and no share", g)
	}
	r = mustAcquire(t, st, t0+21_000_000, call(&c), AcquireKey{Key: "k", Limits: lim, Held: ration.Amount{Requests: 50}, Need: ration.Amount{Requests: 1},
		Demand: ration.Amount{Requests: 60}})
	if g := r.Keys[0]; g.Status != StatusOK || g.Granted.Requests != 1 || g.Share.Zero() {
		t.Fatalf("after the debt's wait: %+v, want the need granted and a share again", g)
	}
}

// TestSpendRateIsWhatTheKeyCanUse: a reported spend rate counts at most
// what the key can admit in a minute (its capacity and a minute's refill),
// so a caller claiming 2^50 per minute weighs like one spending the whole
// limit in the lease policy's proportional split.
func TestSpendRateIsWhatTheKeyCanUse(t *testing.T) {
	var seen []Demand
	st := mustState(t, Config{Policy: PolicyFunc(func(d Demand) int64 { seen = append(seen, d); return d.Want })})
	lim := ration.Limits{RPM: 60, BurstRequests: 90, TPM: 86_400, Window: 24 * time.Hour}
	mustAcquire(t, st, t0, Caller{SpenderID: "x", Epoch: 1, Sequence: 1}, AcquireKey{Key: "k", Limits: lim,
		Want: ration.Amount{Requests: 1, Tokens: 1}, SpendRate: ration.Amount{Requests: ration.MaxAmount, Tokens: ration.MaxAmount}})
	// Requests: 90 + 60*60/86400 per minute... a day's window: refill 60 a day is 0 a minute (rounded down).
	if len(seen) != 2 || seen[0].Rate != 90 || seen[0].RateSum != 90 || seen[1].Rate != 86_400+60 {
		t.Fatalf("policy saw %+v", seen)
	}
}

// TestDemandCountsPerCredential: across credentials, each credential's
// demands together count at most its max-min part of the rate, so a
// caller claiming 2^50 per minute takes no more than what the honest
// demand leaves; within one credential, demands split the rate in
// proportion, as before.
func TestDemandCountsPerCredential(t *testing.T) {
	lim := ration.Limits{RPM: 6000}
	key := func(d int64) AcquireKey {
		return AcquireKey{Key: "k", Limits: lim, Want: ration.Amount{Requests: 1}, Demand: ration.Amount{Requests: d}}
	}
	for _, tt := range []struct {
		name          string
		honest        int64 // per minute
		hostileCred   string
		wantAtLeast   uint32 // the honest share after it renews, millionths
		wantHostileAt uint32 // the hostile share is at most this
	}{
		{"half the rate beside a flood", 3000, "x", 500_000, 500_000},
		{"a fifth beside a flood", 1200, "x", 200_000, 800_000},
		// One credential: the proportional split of the demands as sent.
		{"one credential", 3000, "h", 0, ration.ShareUnit},
	} {
		st := mustState(t, Config{})
		h := Caller{SpenderID: "honest", Epoch: 1, Sequence: 1, Credential: "h"}
		x := Caller{SpenderID: "hostile", Epoch: 1, Sequence: 1, Credential: tt.hostileCred}
		mustAcquire(t, st, t0, h, key(tt.honest))
		rx := mustAcquire(t, st, t0+1000, x, key(ration.MaxAmount))
		h.Sequence++
		rh := mustAcquire(t, st, t0+2000, h, key(tt.honest))
		if got := rh.Keys[0].Share.Requests; got < tt.wantAtLeast {
			t.Errorf("%s: honest share %d, want at least %d", tt.name, got, tt.wantAtLeast)
		}
		if got := rx.Keys[0].Share.Requests; got > tt.wantHostileAt {
			t.Errorf("%s: hostile share %d, want at most %d", tt.name, got, tt.wantHostileAt)
		}
		if tt.hostileCred == "h" && rh.Keys[0].ShareFair.Requests > 1000 {
			t.Errorf("%s: within a credential a flood's proportional split should leave the honest demand almost nothing, got fair %d", tt.name, rh.Keys[0].ShareFair.Requests)
		}
	}
}

// TestQuotaPerCredential: a call that would take its credential beyond
// its quota of sessions, keys, leases or stored answers is refused with a
// *QuotaError and changes nothing; another credential's calls go on; what
// the credential keeps is counted again, the same, after a restore.
func TestQuotaPerCredential(t *testing.T) {
	lim := ration.Limits{RPM: 60}
	keys := func(prefix string, n int) []AcquireKey {
		out := make([]AcquireKey, n)
		for i := range out {
			out[i] = AcquireKey{Key: prefix + string(rune('a'+i)), Limits: lim, Want: ration.Amount{Requests: 1}}
		}
		return out
	}
	quota := Quota{Sessions: 2, Keys: 6}
	st := mustState(t, Config{Quota: quota})
	flood := func(id string, seq uint64) Caller {
		return Caller{SpenderID: id, Epoch: 1, Sequence: seq, Credential: "flood"}
	}
	mustAcquire(t, st, t0, Caller{SpenderID: "other", Epoch: 1, Sequence: 1, Credential: "other"}, keys("z", 4)...)
	mustAcquire(t, st, t0, flood("f1", 1), keys("a", 3)...)
	mustAcquire(t, st, t0, flood("f1", 2), keys("b", 2)...) // keys 5, leases 5, answers 2
	var qe *QuotaError
	for _, tt := range []struct {
		cmd  Command
		what string
	}{
		{Acquire{Now: t0, Caller: flood("f1", 3), Keys: keys("c", 2)}, "keys"},
		{Acquire{Now: t0, Caller: flood("f1", 3), Keys: keys("z", 2)}, "leases"},
		{Acquire{Now: t0, Caller: flood("f2", 1), Keys: append(keys("a", 3), keys("b", 2)...)}, "stored answers"},
		{ReserveAhead{Now: t0, Caller: flood("f1", 3), Keys: []ReserveKey{{Key: "ra", Limits: lim}, {Key: "rb", Limits: lim}}}, "keys"},
	} {
		unchanged(t, st, tt.cmd, ErrResourceExhausted)
		if _, _, err := st.Apply(tt.cmd); !errors.As(err, &qe) || qe.What != tt.what || qe.Limit != quota.Keys {
			t.Fatalf("%+v: %v, want the %s quota", tt.cmd, err, tt.what)
		}
		if err := st.Admit(tt.cmd); !errors.Is(err, ErrResourceExhausted) {
			t.Fatalf("Admit(%+v) = %v", tt.cmd, err)
		}
	}
	mustAcquire(t, st, t0, flood("f2", 1), keys("z", 1)...)
	unchanged(t, st, Acquire{Now: t0, Caller: flood("f3", 1), Keys: keys("a", 1)}, ErrResourceExhausted)
	if _, _, err := st.Apply(Acquire{Now: t0, Caller: flood("f3", 1), Keys: keys("a", 1)}); !errors.As(err, &qe) || qe.What != "sessions" {
		t.Fatalf("third session: %v", err)
	}
	// A retry is answered from its record whatever the quota.
	if _, err := acquire(st, t0, flood("f1", 2), keys("b", 2)...); err != nil {
		t.Fatalf("retry refused: %v", err)
	}
	// Another credential is not affected.
	mustAcquire(t, st, t0, Caller{SpenderID: "other", Epoch: 1, Sequence: 2, Credential: "other"}, keys("y", 2)...)

	want := usageOfAll(st)
	re, err := Restore(st.Config(), st.Snapshot(), t0)
	if err != nil {
		t.Fatal(err)
	}
	re.recount()
	if got := usageOfAll(re); got != want {
		t.Fatalf("usage after a restore %v, want %v", got, want)
	}
	// Expired leases and idle keys free the quota.
	if _, _, err := st.Apply(Sweep{Now: t0 + 3_600_000_000}); err != nil {
		t.Fatal(err)
	}
	if got := usageOfAll(st); got != "" {
		t.Fatalf("usage after everything expired: %v", got)
	}
}

// usageOfAll renders every credential's nonzero usage, sorted.
func usageOfAll(st *State) string {
	var out []byte
	for _, cred := range []string{"", "flood", "other"} {
		u := st.usage[cred]
		if u == nil || *u == (usage{cred: cred}) {
			continue
		}
		out = append(out, []byte(cred+":")...)
		out = append(out, []byte(string(rune('0'+u.sessions))+"/"+string(rune('0'+u.keys))+"/"+string(rune('0'+u.leases))+"/"+string(rune('0'+u.answers))+" ")...)
	}
	return string(out)
}

// TestSweepInParts: sweeping in parts drops what one sweep drops, each key
// in exactly one part and the sessions with part 0, so that a large state
// is swept in short commands; a part outside the parts is bad input.
func TestSweepInParts(t *testing.T) {
	build := func() *State {
		st := mustState(t, Config{})
		for i := range 200 {
			mustAcquire(t, st, t0, Caller{SpenderID: fmt.Sprint("s", i), Epoch: 1, Sequence: 1},
				AcquireKey{Key: fmt.Sprint("k", i), Limits: ration.Limits{RPM: 60}, Want: ration.Amount{Requests: 1}})
		}
		return st
	}
	later := t0 + 2*3_600_000_000
	whole, parts := build(), build()
	want, _, err := whole.Apply(Sweep{Now: later})
	if err != nil {
		t.Fatal(err)
	}
	var got SweepReply
	for p := range uint32(7) {
		r, _, err := parts.Apply(Sweep{Now: later, Part: p, Parts: 7})
		if err != nil {
			t.Fatal(err)
		}
		got.Keys += r.(*SweepReply).Keys
		got.Sessions += r.(*SweepReply).Sessions
		if p == 0 && r.(*SweepReply).Sessions != 200 {
			t.Fatalf("part 0 dropped %d sessions, want all 200", r.(*SweepReply).Sessions)
		}
	}
	if got != *want.(*SweepReply) || got.Keys != 200 || !bytes.Equal(whole.Snapshot(), parts.Snapshot()) {
		t.Fatalf("in parts: %+v, whole: %+v; the states differ: %v", got, want, !bytes.Equal(whole.Snapshot(), parts.Snapshot()))
	}
	unchanged(t, whole, Sweep{Now: later, Part: 7, Parts: 7}, ErrInvalidArgument)
}

// TestPartialSweepDropsAtMost: a partial sweep drops at most
// maxSweepDrops idle keys, the first by name (so the same on every
// replica); the next sweep of that part drops the rest.
func TestPartialSweepDropsAtMost(t *testing.T) {
	st := mustState(t, Config{})
	n := 3 * maxSweepDrops
	keys := make([]AcquireKey, 0, ration.MaxBatch)
	seq := uint64(0)
	for i := range n {
		keys = append(keys, AcquireKey{Key: fmt.Sprintf("k%05d", i), Limits: ration.Limits{RPM: 60}})
		if len(keys) == ration.MaxBatch || i == n-1 {
			seq++
			mustAcquire(t, st, t0, Caller{SpenderID: "s", Epoch: 1, Sequence: seq}, keys...)
			keys = keys[:0]
		}
	}
	var part0 []string
	for name := range st.keys {
		if nameHash(name)%2 == 0 {
			part0 = append(part0, name)
		}
	}
	slices.Sort(part0)
	if len(part0) <= maxSweepDrops {
		t.Fatalf("part 0 has %d keys; the test needs more than %d", len(part0), maxSweepDrops)
	}
	later := t0 + 3_600_000_000
	r, _, err := st.Apply(Sweep{Now: later, Part: 0, Parts: 2})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.(*SweepReply).Keys; got != maxSweepDrops {
		t.Fatalf("a partial sweep dropped %d keys, want %d", got, maxSweepDrops)
	}
	for i, name := range part0 {
		if _, kept := st.keys[name]; kept != (i >= maxSweepDrops) {
			t.Fatalf("key %s (%d of part 0 by name): kept %v", name, i, kept)
		}
	}
	if r, _, _ := st.Apply(Sweep{Now: later, Part: 0, Parts: 2}); r.(*SweepReply).Keys != len(part0)-maxSweepDrops {
		t.Fatalf("the second sweep dropped %d, want the %d left", r.(*SweepReply).Keys, len(part0)-maxSweepDrops)
	}
}
