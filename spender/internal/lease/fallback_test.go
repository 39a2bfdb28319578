package lease

import (
	"testing"

	"github.com/rationhq/ration"
)

// TestFallbackShareOf: a spender's fallback part of a key is its own refill
// share plus an even part of the rate no share took; without shares, the
// even split of the whole limit.
func TestFallbackShareOf(t *testing.T) {
	const unit = ration.ShareUnit
	lim := ration.Limits{RPM: 600, TPM: 60_000}
	for _, tc := range []struct {
		name        string
		lim         ration.Limits
		own, shared ration.Share
		n           int64
		want        ration.Limits
	}{
		{"no shares: the even split", lim, ration.Share{}, ration.Share{}, 3,
			ration.Limits{RPM: 200, TPM: 20_000, BurstRequests: 200, BurstTokens: 20_000}},
		{"alone, its share and the rest", lim, ration.Share{Requests: unit / 2}, ration.Share{Requests: unit / 2}, 1,
			ration.Limits{RPM: 600, TPM: 60_000, BurstRequests: 600, BurstTokens: 60_000}},
		{"a busy spender beside idle ones", lim, ration.Share{Requests: unit * 9 / 10}, ration.Share{Requests: unit * 96 / 100}, 8,
			ration.Limits{RPM: 540 + 3, TPM: 7_500, BurstRequests: 543, BurstTokens: 7_500}},
		{"an idle spender beside a busy one", lim, ration.Share{}, ration.Share{Requests: unit * 96 / 100}, 8,
			ration.Limits{RPM: 3, TPM: 7_500, BurstRequests: 3, BurstTokens: 7_500}},
		{"everything shared, no share: at least 1", lim, ration.Share{}, ration.Share{Requests: unit, Tokens: unit}, 4,
			ration.Limits{RPM: 1, TPM: 1, BurstRequests: 1, BurstTokens: 1}},
		{"an unlimited dimension stays unlimited", ration.Limits{RPM: 600}, ration.Share{Requests: unit}, ration.Share{Requests: unit}, 2,
			ration.Limits{RPM: 600, BurstRequests: 600}},
		{"the largest amounts do not overflow", ration.Limits{RPM: ration.MaxAmount}, ration.Share{Requests: unit - 1}, ration.Share{Requests: unit - 1}, 1,
			ration.Limits{RPM: ration.MaxAmount, BurstRequests: ration.MaxAmount}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := FallbackShareOf(tc.lim, tc.own, tc.shared, tc.n); got != tc.want {
				t.Errorf("FallbackShareOf = %+v, want %+v", got, tc.want)
			}
		})
	}
}
