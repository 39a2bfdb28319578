package bucket

import (
	"errors"
	"testing"
	"time"
)

// Fixed instants, in microseconds.
const (
	t0 Instant = 0
	t1 Instant = 1_000_000 // 1 s
	t2 Instant = 1_200_000 // 1.2 s
	t3 Instant = 2_000_000 // 2 s
	t4 Instant = 60_000_000
	t5 Instant = 3_600_000_000 // 1 h
)

// step is one operation on a bucket at an instant, with what it must report
// and the level (whole tokens) it must leave.
type step struct {
	at     Instant
	op     string // "take" (TakeNow), "ahead" (ReserveAhead with maxWait), "give", "charge", "advance"
	n      int64
	max    time.Duration
	ok     bool
	wait   time.Duration
	tokens int64
}

func run(t *testing.T, b Bucket, steps []step) {
	t.Helper()
	for i, s := range steps {
		var (
			wait time.Duration
			ok   = true
		)
		switch s.op {
		case "take":
			wait, ok = b.TakeNow(s.at, s.n)
		case "ahead":
			wait, ok = b.ReserveAhead(s.at, s.n, s.max)
		case "give":
			b.Give(s.n)
		case "charge":
			b.Charge(s.at, s.n)
		case "advance":
			b.Advance(s.at)
		default:
			t.Fatalf("step %d: unknown op %q", i, s.op)
		}
		if ok != s.ok || wait != s.wait || b.Tokens() != s.tokens {
			t.Fatalf("step %d (%s %d at %d): ok=%v wait=%v tokens=%d; want ok=%v wait=%v tokens=%d",
				i, s.op, s.n, s.at, ok, wait, b.Tokens(), s.ok, s.wait, s.tokens)
		}
	}
}

func mustNew(t *testing.T, l Limit, now Instant) Bucket {
	t.Helper()
	b, err := New(l, now)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestHandExampleTokens is the worked example of docs/contract.md on the token bucket alone.
func TestHandExampleTokens(t *testing.T) {
	b := mustNew(t, PerMinute(1000), t0)
	run(t, b, []step{
		{at: t0, op: "take", n: 300, ok: true, tokens: 700},
		{at: t0, op: "give", n: 180, ok: true, tokens: 880},
		{at: t0, op: "take", n: 900, ok: false, wait: 1200 * time.Millisecond, tokens: 880},
		{at: t2, op: "take", n: 900, ok: true, tokens: 0},
	})
	b = mustNew(t, PerMinute(3), t0)
	b.TakeNow(t0, 1)
	b.TakeNow(t2, 1) // 2 + 0.06 - 1 = 1.06
	if u, s := b.Level(); u != 106*s/100 {
		t.Fatalf("request bucket level = %d/%d, want 1.06", u, s)
	}
}

func TestBucketSteps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lim   Limit
		steps []step
	}{
		{"refill is capped", PerMinute(60), []step{
			{at: t0, op: "take", n: 60, ok: true, tokens: 0},
			{at: t0, op: "take", n: 1, wait: time.Second, tokens: 0},
			{at: t1, op: "take", n: 1, ok: true, tokens: 0},
			{at: t5, op: "advance", ok: true, tokens: 60},
			{at: t5, op: "take", n: 61, wait: InfDuration, tokens: 60},
		}},
		{"clock steps back mints nothing", PerMinute(60), []step{
			{at: t3, op: "take", n: 60, ok: true, tokens: 0},
			{at: t1, op: "take", n: 1, wait: time.Second, tokens: 0}, // back 1 s: no refill, same wait
			{at: t3, op: "take", n: 1, wait: time.Second, tokens: 0}, // forward again: still nothing
			{at: t3 + 1_000_000, op: "take", n: 1, ok: true, tokens: 0},
		}},
		{"charge goes below zero and is waited off", PerMinute(600), []step{
			{at: t0, op: "take", n: 100, ok: true, tokens: 500},
			{at: t0, op: "charge", n: 600, ok: true, tokens: -100},
			{at: t0, op: "take", n: 10, wait: 11 * time.Second, tokens: -100},
			{at: t0 + 11_000_000, op: "take", n: 10, ok: true, tokens: 0},
		}},
		{"give is capped and needs no advance", PerMinute(60), []step{
			{at: t0, op: "take", n: 10, ok: true, tokens: 50},
			{at: t4, op: "give", n: 10, ok: true, tokens: 60},
			{at: t4, op: "advance", ok: true, tokens: 60},
		}},
		{"reserve ahead", Limit{Capacity: 2, Refill: 30, Period: time.Minute}, []step{
			{at: t0, op: "ahead", n: 1, max: time.Minute, ok: true, tokens: 1},
			{at: t0, op: "ahead", n: 1, max: time.Minute, ok: true, tokens: 0},
			{at: t0, op: "ahead", n: 1, max: time.Minute, ok: true, wait: 2 * time.Second, tokens: -1},
			{at: t0, op: "ahead", n: 1, max: 3 * time.Second, ok: false, wait: 4 * time.Second, tokens: -1},
			{at: t0, op: "ahead", n: 3, max: time.Hour, ok: false, wait: InfDuration, tokens: -1},
		}},
		{"burst independent of rate", Limit{Capacity: 5, Refill: 1, Period: time.Second}, []step{
			{at: t0, op: "take", n: 5, ok: true, tokens: 0},
			{at: t3, op: "take", n: 3, wait: time.Second, tokens: 2},
			{at: t5, op: "take", n: 5, ok: true, tokens: 0},
		}},
		{"awkward prime rate rounds waits up", Limit{Capacity: 7, Refill: 7, Period: time.Minute}, []step{
			{at: t0, op: "take", n: 7, ok: true, tokens: 0},
			// one token per 60/7 s = 8.571428...s, rounded up to the microsecond
			{at: t0, op: "take", n: 1, wait: 8_571_429 * time.Microsecond, tokens: 0},
			{at: 8_571_428, op: "take", n: 1, wait: time.Microsecond, tokens: 0},
			{at: 8_571_429, op: "take", n: 1, ok: true, tokens: 0},
		}},
		{"huge charge saturates", PerMinute(10), []step{
			{at: t0, op: "charge", n: 1<<63 - 1, ok: true, tokens: -((MaxScaled + 6_000_000 - 1) / 6_000_000)},
			{at: t0, op: "give", n: 1<<63 - 1, ok: true, tokens: 10},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { run(t, mustNew(t, tc.lim, t0), tc.steps) })
	}
}

func TestLimitValidate(t *testing.T) {
	for _, l := range []Limit{
		{},
		{Capacity: -1, Refill: 1, Period: time.Second},
		{Capacity: 1, Refill: 0, Period: time.Second},
		{Capacity: 1, Refill: 1, Period: 0},
		{Capacity: 1, Refill: 1, Period: 1500 * time.Nanosecond},
		{Capacity: 1 << 40, Refill: 7, Period: time.Minute},
		{Capacity: 1, Refill: 1 << 62, Period: time.Minute},
	} {
		if err := l.Validate(); !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalidLimit", l, err)
		}
		if _, err := New(l, 0); !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("New(%+v) = %v, want ErrInvalidLimit", l, err)
		}
	}
	for _, l := range []Limit{PerMinute(1), PerMinute(1_000_000_000), PerMinute(999_999_937), {Capacity: 1, Refill: 1, Period: time.Microsecond}} {
		if err := l.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", l, err)
		}
	}
}

func TestSetLimitMintsNothing(t *testing.T) {
	b := mustNew(t, PerMinute(1000), t0)
	b.TakeNow(t0, 900) // 100 left
	if err := b.SetLimit(PerMinute(100_000), t0); err != nil {
		t.Fatal(err)
	}
	if b.Tokens() != 100 {
		t.Fatalf("raising the limit: %d tokens, want 100", b.Tokens())
	}
	if err := b.SetLimit(PerMinute(7), t0); err != nil {
		t.Fatal(err)
	}
	if b.Tokens() != 7 {
		t.Fatalf("lowering the limit: %d tokens, want 7 (capped)", b.Tokens())
	}
	b.Charge(t0, 20) // -13
	if err := b.SetLimit(PerMinute(60), t0); err != nil {
		t.Fatal(err)
	}
	if b.Tokens() != -13 {
		t.Fatalf("debt after a change: %d tokens, want -13", b.Tokens())
	}
	if err := b.SetLimit(Limit{}, t0); !errors.Is(err, ErrInvalidLimit) || b.Limit() != PerMinute(60) {
		t.Fatalf("an invalid limit changed the bucket: %v, %+v", err, b.Limit())
	}
}

func TestStateRoundTrip(t *testing.T) {
	b := mustNew(t, PerMinute(1000), t1)
	b.Charge(t2, 1234)
	c, err := FromState(b.Limit(), b.State())
	if err != nil || c != b {
		t.Fatalf("FromState = %+v, %v; want %+v", c, err, b)
	}
	for _, s := range []State{{Level: b.full + 1}, {Level: -MaxScaled - 1}} {
		if _, err := FromState(b.Limit(), s); !errors.Is(err, ErrInvalidState) {
			t.Errorf("FromState(%+v) = %v, want ErrInvalidState", s, err)
		}
	}
	if b.FullAt() != t2.Add(b.TimeToFull()) {
		t.Fatalf("FullAt = %d, want %d", b.FullAt(), t2.Add(b.TimeToFull()))
	}
}

func TestInstant(t *testing.T) {
	epoch := time.Unix(1000, 0)
	for _, tc := range []struct {
		t    time.Time
		want Instant
	}{
		{epoch, 0},
		{epoch.Add(1500 * time.Nanosecond), 1},
		{epoch.Add(-1 * time.Nanosecond), -1},
		{epoch.Add(-1000 * time.Nanosecond), -1},
		{epoch.Add(-1001 * time.Nanosecond), -2},
	} {
		if got := InstantOf(epoch, tc.t); got != tc.want {
			t.Errorf("InstantOf(%v) = %d, want %d", tc.t.Sub(epoch), got, tc.want)
		}
	}
	if got := Instant(5).Add(1500 * time.Nanosecond); got != 7 {
		t.Errorf("Add rounds up: got %d, want 7", got)
	}
	if got := Instant(1<<63 - 10).Add(time.Hour); got != 1<<63-1 {
		t.Errorf("Add saturates: got %d", got)
	}
	if got := Instant(3).Time(epoch); !got.Equal(epoch.Add(3 * time.Microsecond)) {
		t.Errorf("Time = %v", got)
	}
}

// TestWithLevel: a copy at another level reports that level's tokens and
// time to full, clamps to the bucket's range, and leaves the original alone.
func TestWithLevel(t *testing.T) {
	b, err := New(PerMinute(1000), 0) // 1000 tokens a minute: 60 ms per token
	if err != nil {
		t.Fatal(err)
	}
	b.Take(300)
	u, s := b.Level()
	c := b.WithLevel(u - s/2) // half a token less
	if got := c.Tokens(); got != 699 {
		t.Errorf("Tokens = %d, want 699", got)
	}
	if got := c.TimeToFull(); got != 18*time.Second+30*time.Millisecond {
		t.Errorf("TimeToFull = %v, want 18.03s", got)
	}
	if got := b.Tokens(); got != 700 {
		t.Errorf("original moved: %d", got)
	}
	if hi := b.WithLevel(1 << 62); hi.Tokens() != 1000 {
		t.Errorf("above full: %d tokens, want 1000", hi.Tokens())
	}
	if lo := b.WithLevel(-1 << 62); lo.level != -MaxScaled {
		t.Errorf("below the floor: level %d, want %d", lo.level, int64(-MaxScaled))
	}
}
