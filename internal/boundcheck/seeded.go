package boundcheck

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/rationhq/ration"
)

// Seeded is a T whose choices come from a PCG generator seeded with its
// seed: the same seed gives the same choices. It reports failures to its
// test with the seed, so that a failing run can be replayed. Labels are
// not used.
type Seeded struct {
	tb   testing.TB
	seed uint64
	rnd  *rand.Rand
}

// NewSeeded returns a Seeded drawing from seed, failing tb.
func NewSeeded(tb testing.TB, seed uint64) *Seeded {
	return &Seeded{tb: tb, seed: seed, rnd: rand.New(rand.NewPCG(seed, 0x7261_7469_6f6e))}
}

// IntRange returns an int in [lo, hi], drawn as Int64Range draws.
func (s *Seeded) IntRange(lo, hi int, _ string) int {
	return int(s.Int64Range(int64(lo), int64(hi), ""))
}

// Int64Range returns an int64 in [lo, hi]: uniformly a quarter of the
// time; otherwise at a distance from lo or (less often) from hi drawn
// log-uniformly, so that small amounts, the ends and values near them
// (where a bound is reached: a pool spent to the last unit, a want of the
// whole bucket) come up as often as the rest.
func (s *Seeded) Int64Range(lo, hi int64, _ string) int64 {
	n := uint64(hi - lo)
	mode := s.rnd.IntN(4)
	if mode == 0 || n == 0 {
		return lo + int64(s.rnd.Uint64N(n+1))
	}
	d := s.rnd.Uint64N(uint64(1) << s.rnd.IntN(bits.Len64(n)+1))
	d = min(d, n)
	if mode == 3 {
		return hi - int64(d)
	}
	return lo + int64(d)
}

// Choice returns one of 0 to n-1, uniformly (n > 0): for choosing among
// steps, where Int64Range would favour the first and the last.
func (s *Seeded) Choice(n int) int { return s.rnd.IntN(n) }

// Bool returns true or false, each half the time.
func (s *Seeded) Bool(string) bool { return s.rnd.IntN(2) == 0 }

// Amount returns requests in [0, max/10+1] and tokens in [0, max].
func (s *Seeded) Amount(max int64, _ string) ration.Amount {
	return ration.Amount{Requests: s.Int64Range(0, max/10+1, ""), Tokens: s.Int64Range(0, max, "")}
}

// Fatalf fails the test with the message, prefixed with the seed.
func (s *Seeded) Fatalf(format string, args ...any) {
	s.tb.Helper()
	s.tb.Fatalf("seed %d: %s", s.seed, fmt.Sprintf(format, args...))
}
