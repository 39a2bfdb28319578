package ledger

import (
	"math/big"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"pgregory.net/rapid"
)

// TestRatePerMatchesBigInt: ratePer is ceil(rate × h / minute), capped at
// MaxAmount, whether the product fits 64 bits (a plain division) or not
// (a 128-bit one).
func TestRatePerMatchesBigInt(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rate := rapid.OneOf(rapid.Int64Range(-1, 1000), rapid.Int64Range(0, ration.MaxRate), rapid.Int64Range(0, 1<<62)).Draw(t, "rate")
		h := time.Duration(rapid.OneOf(rapid.Int64Range(-1, int64(time.Second)), rapid.Int64Range(0, int64(time.Hour)), rapid.Int64Range(0, 1<<62)).Draw(t, "h"))
		want := int64(0)
		if rate > 0 && h > 0 {
			p := new(big.Int).Mul(big.NewInt(rate), big.NewInt(int64(h)))
			q, r := new(big.Int).QuoRem(p, big.NewInt(int64(time.Minute)), new(big.Int))
			if r.Sign() != 0 {
				q.Add(q, big.NewInt(1))
			}
			want = ration.MaxAmount
			if q.Cmp(big.NewInt(ration.MaxAmount)) < 0 {
				want = q.Int64()
			}
		}
		if got := ratePer(rate, h); got != want {
			t.Fatalf("ratePer(%d, %v) = %d, want %d", rate, h, got, want)
		}
	})
}
