package ledger

import (
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

func commandCases() []struct {
	name string
	cmd  Command
} {
	caller := Caller{SpenderID: "gw-1", Epoch: 7, Sequence: 42}
	lim := ration.Limits{RPM: 600, TPM: 1_000_000, BurstRequests: 1200, BurstTokens: 3, Window: 24 * time.Hour}
	return []struct {
		name string
		cmd  Command
	}{
		{"acquire one key", Acquire{Now: 1_800_000_000_000_001, Caller: caller, Keys: []AcquireKey{{
			Key: "k", Limits: lim, Want: ration.Amount{Requests: 10, Tokens: 5000}, Need: ration.Amount{Requests: 1, Tokens: 100},
			SpendRate: ration.Amount{Requests: 3, Tokens: 4}, Returned: ration.Amount{Requests: 5, Tokens: 6},
			Held: ration.Amount{Requests: 7, Tokens: 8}, Debt: ration.Amount{Requests: 9, Tokens: 10},
			Demand: ration.Amount{Requests: 11, Tokens: 12},
		}}}},
		{"acquire no keys", Acquire{Now: 1, Caller: caller}},
		{"acquire with a credential", Acquire{Now: 1, Caller: Caller{SpenderID: "gw", Epoch: 1, Sequence: 2, Credential: strings.Repeat("c", MaxCredentialLen)}}},
		{"acquire invalid values kept", Acquire{Now: -5, Caller: Caller{}, Keys: []AcquireKey{
			{Key: "", Limits: ration.Limits{RPM: -1, TPM: math.MaxInt64, Window: -time.Second}, Want: ration.Amount{Requests: -1, Tokens: math.MinInt64}},
			{Key: "", Demand: ration.Amount{Requests: math.MaxInt64}},
		}}},
		{"acquire max lengths", Acquire{Now: 2, Caller: Caller{SpenderID: strings.Repeat("s", ration.MaxSpenderIDLen), Epoch: math.MaxUint64, Sequence: math.MaxUint64},
			Keys: []AcquireKey{{Key: strings.Repeat("k", ration.MaxKeyLen)}}}},
		{"reserve", ReserveAhead{Now: 3, Caller: caller, Keys: []ReserveKey{
			{Key: "a", Limits: lim, Cost: ration.Amount{Requests: 1, Tokens: 900}, MaxWait: 1500 * time.Millisecond},
			{Key: "b", Limits: ration.Limits{TPM: 7}, MaxWait: -1},
		}}},
		{"release", Release{Now: 4, Caller: caller, Keys: []ReleaseKey{
			{Key: "a", Limits: lim, Returned: ration.Amount{Requests: 2, Tokens: 3}, Debt: ration.Amount{Tokens: 77}},
		}}},
		{"release no keys", Release{Now: 4, Caller: caller}},
		{"sweep", Sweep{Now: 1_800_000_000_000_000}},
		{"sweep a part", Sweep{Now: 1_800_000_000_000_000, Part: 3, Parts: 16}},
		{"sweep zero", Sweep{}},
	}
}

func TestCommandRoundTrip(t *testing.T) {
	for _, tc := range commandCases() {
		t.Run(tc.name, func(t *testing.T) {
			b, err := EncodeCommand(tc.cmd)
			if err != nil {
				t.Fatal(err)
			}
			if b[0] != commandVersion {
				t.Fatalf("version byte %d", b[0])
			}
			got, err := DecodeCommand(b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.cmd) {
				t.Fatalf("round trip:\n got %#v\nwant %#v", got, tc.cmd)
			}
		})
	}
}

// TestCommandVersion1: a command of the format before credentials decodes
// with none.
func TestCommandVersion1(t *testing.T) {
	e := enc{}
	e.byte(1)
	e.byte(cmdAcquire)
	e.i(5)
	e.str("gw")
	e.u(3)
	e.u(4)
	e.u(0) // no keys
	got, err := DecodeCommand(e.b)
	want := Acquire{Now: 5, Caller: Caller{SpenderID: "gw", Epoch: 3, Sequence: 4}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("version 1 = %#v, %v; want %#v", got, err, want)
	}
	e.b[0] = commandVersion + 1
	if _, err := DecodeCommand(e.b); err == nil {
		t.Fatal("a later version decoded")
	}
}

func TestCommandMaxBatch(t *testing.T) {
	keys := make([]ReleaseKey, ration.MaxBatch)
	for i := range keys {
		keys[i] = ReleaseKey{Key: strings.Repeat("x", i%ration.MaxKeyLen+1), Debt: ration.Amount{Tokens: int64(i)}}
	}
	cmd := Release{Now: 9, Caller: Caller{SpenderID: "s", Epoch: 1, Sequence: 1}, Keys: keys}
	b, err := EncodeCommand(cmd)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeCommand(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, Command(cmd)) {
		t.Fatal("round trip of a full batch differs")
	}
}

// What the decoder would refuse is refused at encoding, as invalid input.
func TestEncodeCommandRefuses(t *testing.T) {
	c := Caller{SpenderID: "s", Epoch: 1, Sequence: 1}
	for _, tc := range []struct {
		name string
		cmd  Command
	}{
		{"long spender id", Acquire{Caller: Caller{SpenderID: strings.Repeat("s", ration.MaxSpenderIDLen+1)}}},
		{"long key", ReserveAhead{Caller: c, Keys: []ReserveKey{{Key: "a"}, {Key: strings.Repeat("k", ration.MaxKeyLen+1)}}}},
		{"batch too large", Release{Caller: c, Keys: make([]ReleaseKey, ration.MaxBatch+1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := EncodeCommand(tc.cmd); !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("err = %v, want ErrInvalidArgument", err)
			}
		})
	}
	for _, cmd := range []Command{&Acquire{}, &Sweep{}, nil} {
		if _, err := EncodeCommand(cmd); err == nil {
			t.Fatalf("%T: no error", cmd)
		}
	}
}

func randAmount(r *rand.Rand) ration.Amount {
	return ration.Amount{Requests: randInt(r), Tokens: randInt(r)}
}

// randInt returns small, large, negative and extreme values.
func randInt(r *rand.Rand) int64 {
	switch r.IntN(6) {
	case 0:
		return 0
	case 1:
		return r.Int64N(1000)
	case 2:
		return r.Int64()
	case 3:
		return -r.Int64()
	case 4:
		return math.MinInt64
	}
	return math.MaxInt64
}

func randString(r *rand.Rand, max int) string {
	b := make([]byte, r.IntN(max+1))
	for i := range b {
		b[i] = byte(r.UintN(256))
	}
	return string(b)
}

func randLimits(r *rand.Rand) ration.Limits {
	return ration.Limits{RPM: randInt(r), TPM: randInt(r), BurstRequests: randInt(r), BurstTokens: randInt(r), Window: time.Duration(randInt(r))}
}

func randCaller(r *rand.Rand) Caller {
	return Caller{SpenderID: randString(r, ration.MaxSpenderIDLen), Epoch: r.Uint64(), Sequence: r.Uint64() >> r.IntN(64)}
}

func randCommand(r *rand.Rand) Command {
	now := bucket.Instant(randInt(r))
	n := r.IntN(5)
	if r.IntN(50) == 0 {
		n = ration.MaxBatch
	}
	switch r.IntN(4) {
	case 0:
		c := Acquire{Now: now, Caller: randCaller(r)}
		for range n {
			c.Keys = append(c.Keys, AcquireKey{Key: randString(r, 40), Limits: randLimits(r), Want: randAmount(r), Need: randAmount(r),
				SpendRate: randAmount(r), Returned: randAmount(r), Held: randAmount(r), Debt: randAmount(r), Demand: randAmount(r)})
		}
		return c
	case 1:
		c := ReserveAhead{Now: now, Caller: randCaller(r)}
		for range n {
			c.Keys = append(c.Keys, ReserveKey{Key: randString(r, 40), Limits: randLimits(r), Cost: randAmount(r), MaxWait: time.Duration(randInt(r))})
		}
		return c
	case 2:
		c := Release{Now: now, Caller: randCaller(r)}
		for range n {
			c.Keys = append(c.Keys, ReleaseKey{Key: randString(r, 40), Limits: randLimits(r), Returned: randAmount(r), Debt: randAmount(r)})
		}
		return c
	}
	return Sweep{Now: now}
}

// Random commands of every kind, with any field values, round-trip
// exactly; every strict prefix of an encoding, and the encoding with a
// trailing byte, fails to decode (without panicking).
func TestCommandRandomRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 2026))
	for i := range 2000 {
		cmd := randCommand(r)
		b, err := EncodeCommand(cmd)
		if err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
		got, err := DecodeCommand(b)
		if err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
		if !reflect.DeepEqual(got, cmd) {
			t.Fatalf("command %d round trip:\n got %#v\nwant %#v", i, got, cmd)
		}
		if len(b) < 4096 { // every prefix of the small ones, a sample of the large ones
			for n := range len(b) {
				if _, err := DecodeCommand(b[:n]); err == nil {
					t.Fatalf("command %d: prefix of %d/%d bytes decoded", i, n, len(b))
				}
			}
		} else {
			for range 64 {
				n := r.IntN(len(b))
				if _, err := DecodeCommand(b[:n]); err == nil {
					t.Fatalf("command %d: prefix of %d/%d bytes decoded", i, n, len(b))
				}
			}
		}
		if _, err := DecodeCommand(append(b, 0)); err == nil {
			t.Fatalf("command %d: trailing byte accepted", i)
		}
	}
}

// Garbage never panics; flipped bytes in valid encodings either fail or
// decode to a command that re-encodes to the same bytes.
func TestDecodeCommandGarbage(t *testing.T) {
	for _, b := range [][]byte{
		nil, {}, {0}, {commandVersion}, {commandVersion + 1, cmdSweep, 0}, {commandVersion, 0, 0}, {commandVersion, 9, 0},
		{commandVersion, cmdAcquire, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		{commandVersion, cmdAcquire, 0, 200, 1},                   // spender id over MaxSpenderIDLen
		{commandVersion, cmdRelease, 0, 1, 's', 1, 1, 0x81, 0x08}, // 1025 keys
	} {
		if _, err := DecodeCommand(b); err == nil {
			t.Fatalf("%x decoded", b)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		b := make([]byte, r.IntN(64))
		for i := range b {
			b[i] = byte(r.UintN(256))
		}
		if r.IntN(2) == 0 && len(b) > 1 {
			b[0], b[1] = commandVersion, byte(r.IntN(5))
		}
		DecodeCommand(b) // must not panic
	}
	for i := range 2000 {
		b, err := EncodeCommand(randCommand(r))
		if err != nil {
			t.Fatal(err)
		}
		b[r.IntN(len(b))] ^= byte(1 + r.UintN(255))
		cmd, err := DecodeCommand(b)
		if err != nil {
			continue
		}
		again, err := EncodeCommand(cmd)
		if err != nil {
			t.Fatalf("mutation %d: decoded command does not re-encode: %v", i, err)
		}
		if !reflect.DeepEqual(again, b) {
			// Varints have one encoding each except non-minimal ones
			// (a 0x80 continuation followed by 0x00), which a flipped
			// byte can create; those must still decode consistently.
			if _, err := DecodeCommand(again); err != nil {
				t.Fatalf("mutation %d: re-encoding fails to decode: %v", i, err)
			}
		}
	}
}
