package ledger

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// Version 2 key records are exact for any limits and levels: decimal
// limits (round or not, up to MaxRate), levels written from zero or from
// full (full, near full, half, zero, debt down to -MaxScaled), instants
// relative to the first bucket's.
func TestKeyRecordRoundTrip(t *testing.T) {
	now := bucket.Instant(1_800_000_000_123_457)
	limits := []ration.Limits{
		{RPM: 1_000_000_000, TPM: 1_000_000_000_000},
		{RPM: 600, TPM: 123_456_789, BurstTokens: 100_000_000_000},
		{RPM: ration.MaxRate, TPM: ration.MaxRate, BurstRequests: ration.MaxRate, BurstTokens: 10},
		{TPM: 7}, {RPM: 1}, {RPM: 3_000, BurstRequests: 30_000},
		{RPM: 10_000, TPM: 2_000_000, Window: 24 * time.Hour}, {TPM: 7, Window: time.Second},
		{RPM: 1, Window: ration.MaxWindow},
	}
	for _, lim := range limits {
		if err := validateLimits(0, lim); err != nil {
			t.Fatalf("test limits %+v: %v", lim, err)
		}
		for _, frac := range []float64{1, 0.999, 0.5, 0.49, 0.01, 0, -0.3, -1} {
			k := &keyState{}
			k.setLimits(lim, now)
			for _, d := range []*dim{&k.req, &k.tok} {
				if !d.on {
					continue
				}
				full := fullUnits(&d.b)
				level := int64(float64(full) * frac)
				if frac == -1 {
					level = -bucket.MaxScaled
				}
				b, err := bucket.FromState(d.b.Limit(), bucket.State{Level: level, Last: now - 77})
				if err != nil {
					t.Fatalf("%+v at %v: %v", lim, frac, err)
				}
				d.b = b
			}
			k.holds = []holding{{spender: "a", epoch: 3, lastSeq: 9, held: ration.Amount{Requests: 1, Tokens: 2}, rate: ration.Amount{Requests: 3, Tokens: 4}, expiry: now + 10_000_000},
				{spender: "b", epoch: 1, lastSeq: 1, expiry: now - 5}}
			if frac < 0.5 { // half the records carry shares
				k.holds[1].demand = ration.Amount{Requests: 5, Tokens: 6}
				k.holds[1].setShare(ration.Share{Requests: ration.ShareUnit, Tokens: 7}, ration.Limits{RPM: 5, TPM: 6, Window: time.Hour}, ration.Amount{Requests: 8, Tokens: 9}, now-3)
				k.holds[1].accrued = ration.Amount{Requests: 10, Tokens: 11}
			}
			got, err := decodeKey(appendKey(nil, k))
			if err != nil {
				t.Fatalf("%+v at %v: %v", lim, frac, err)
			}
			if !reflect.DeepEqual(got, k) {
				t.Fatalf("%+v at %v: decoded %+v, want %+v", lim, frac, got, k)
			}
		}
	}
}

func TestDecimal(t *testing.T) {
	for _, v := range []int64{0, 1, 9, 10, 11, 100, 1_000_000_000_000, 999_999_999_001, 999_999_999_999, 2_500_000, ration.MaxRate} {
		var e enc
		e.decimal(v)
		d := &dec{b: e.b}
		if got := d.decimal(ration.MaxRate); got != v || d.done() != nil {
			t.Errorf("decimal %d: got %d (%v)", v, got, d.err)
		}
	}
	for _, u := range []uint64{(ration.MaxRate + 1) << 4, 2<<4 | 12, 1<<4 | 13, 1<<4 | 15, 1 << 63} {
		var e enc
		e.u(u)
		d := &dec{b: e.b}
		if got := d.decimal(ration.MaxRate); d.err == nil {
			t.Errorf("decimal %s: got %d, want an error", fmt.Sprintf("%#x", u), got)
		}
	}
}
