package bucket

import (
	"fmt"
	"math/bits"
	"time"
)

// Bucket is a token bucket with an exact fixed-point level. The zero value
// is not usable; make one with New or FromState.
//
// Operations come in two layers. The composable layer (Advance, then
// Covers/Wait, then Take/Give) lets an owner check several buckets before
// changing any, so that a multi-dimension cost is taken all or nothing. The
// one-call layer (TakeNow, ReserveAhead, Charge) does the same for a single
// bucket.
//
// A Bucket is not safe for concurrent use; see the package doc.
type Bucket struct {
	lim   Limit
	scale int64   // fixed-point units per token
	inc   int64   // units added per microsecond of refill
	full  int64   // lim.Capacity * scale
	level int64   // units; in [-MaxScaled, full]
	last  Instant // the instant the level was last refilled to
}

// New returns a full bucket for l, last refilled at now.
func New(l Limit, now Instant) (Bucket, error) {
	if err := l.Validate(); err != nil {
		return Bucket{}, err
	}
	var b Bucket
	b.setParams(l)
	b.level = b.full
	b.last = now
	return b, nil
}

// State is the persistent form of a Bucket: its level in fixed-point units
// of its Limit and the instant of its last refill. It is meaningful only
// together with the Limit it was taken under.
type State struct {
	Level int64   // fixed-point units (see Bucket.Scale); negative is debt
	Last  Instant // last refill
}

// State returns b's persistent form.
func (b *Bucket) State() State { return State{Level: b.level, Last: b.last} }

// FromState rebuilds a bucket from a State taken under l. It returns an
// error wrapping ErrInvalidLimit or ErrInvalidState when either is out of
// range, so corrupt stored data cannot mint tokens.
func FromState(l Limit, s State) (Bucket, error) {
	if err := l.Validate(); err != nil {
		return Bucket{}, err
	}
	var b Bucket
	b.setParams(l)
	if s.Level > b.full || s.Level < -MaxScaled {
		return Bucket{}, fmt.Errorf("bucket: level %d outside [%d, %d]: %w", s.Level, -MaxScaled, b.full, ErrInvalidState)
	}
	b.level, b.last = s.Level, s.Last
	return b, nil
}

func (b *Bucket) setParams(l Limit) {
	b.lim = l
	b.scale, b.inc = l.scaleOf()
	b.full = l.Capacity * b.scale
}

// Limit returns the bucket's current limit.
func (b *Bucket) Limit() Limit { return b.lim }

// Scale returns the number of fixed-point units in one token.
func (b *Bucket) Scale() int64 { return b.scale }

// Last returns the instant the bucket was last refilled to.
func (b *Bucket) Last() Instant { return b.last }

// Advance refills the bucket to now: the level grows by Refill/Period for
// every microsecond since the last refill, capped at Capacity. An instant
// at or before the last refill changes nothing.
func (b *Bucket) Advance(now Instant) {
	if now <= b.last {
		return
	}
	dt := uint64(now) - uint64(b.last) // exact even if the int64 difference overflows
	b.last = now
	need := uint64(b.full - b.level) // in [0, 2*MaxScaled]
	if need == 0 {
		return
	}
	hi, lo := bits.Mul64(dt, uint64(b.inc))
	if hi != 0 || lo >= need {
		b.level = b.full
		return
	}
	b.level += int64(lo)
}

// Tokens returns the level in whole tokens, rounded down (towards minus
// infinity, so a debt of half a token reads -1). It does not advance.
func (b *Bucket) Tokens() int64 {
	q := b.level / b.scale
	if b.level < 0 && b.level%b.scale != 0 {
		q--
	}
	return q
}

// Level returns the exact level as a fraction units/Scale of a token. It
// does not advance.
func (b *Bucket) Level() (units, scale int64) { return b.level, b.scale }

// WithLevel returns a copy of b whose level is units (as Level reports
// them), clamped to [-MaxScaled, full]. A caller that keeps only a level it
// read can report Tokens and TimeToFull for it later from an unshared copy
// of the bucket's parameters, without the bucket itself.
func (b Bucket) WithLevel(units int64) Bucket {
	b.level = min(max(units, -MaxScaled), b.full)
	return b
}

// Fits reports whether a cost of n tokens can ever be covered: 0 <= n <= Capacity.
func (b *Bucket) Fits(n int64) bool { return n >= 0 && n <= b.lim.Capacity }

// Covers reports whether the level, as of the last Advance, holds n tokens.
// It is false for any n above Capacity.
func (b *Bucket) Covers(n int64) bool {
	return b.Fits(n) && b.level >= n*b.scale
}

// Wait returns how long after the last refill the level will hold n tokens,
// rounded up to the microsecond: 0 if it already does, InfDuration if n is
// above Capacity. It does not advance.
func (b *Bucket) Wait(n int64) time.Duration {
	if !b.Fits(n) {
		return InfDuration
	}
	deficit := n*b.scale - b.level
	if deficit <= 0 {
		return 0
	}
	return micros(ceilDiv(deficit, b.inc))
}

// TimeToFull returns how long after the last refill the bucket will be full
// again, rounded up to the microsecond (0 when full). It does not advance.
func (b *Bucket) TimeToFull() time.Duration {
	return micros(ceilDiv(b.full-b.level, b.inc))
}

// FullAt returns the instant the bucket will be full if nothing is taken.
// A full bucket holds no information, so its owner may drop it from then on
// and recreate it with New.
func (b *Bucket) FullAt() Instant {
	return b.last.Add(b.TimeToFull())
}

// units converts n tokens (n >= 0) to fixed-point units, saturating at
// 2*MaxScaled, which is beyond any level.
func (b *Bucket) units(n int64) int64 {
	if n <= b.lim.Capacity || n <= MaxScaled/b.scale {
		return n * b.scale
	}
	return 2 * MaxScaled
}

// Take removes n tokens without a floor: the level may go negative (debt),
// saturating at -MaxScaled. It does not advance; call Advance first so that
// the refill up to now is counted before the cap can waste it. n <= 0 does
// nothing.
func (b *Bucket) Take(n int64) {
	if n <= 0 {
		return
	}
	b.level -= b.units(n)
	if b.level < -MaxScaled {
		b.level = -MaxScaled
	}
}

// Give returns n tokens, capped at Capacity. It needs no Advance: refill and
// give-back both only add, so capping commutes with them and the result is
// the same whenever the refill is counted. n <= 0 does nothing.
func (b *Bucket) Give(n int64) {
	if n <= 0 {
		return
	}
	b.level += b.units(n)
	if b.level > b.full {
		b.level = b.full
	}
}

// TakeNow advances to now and takes n tokens if the level covers them. It
// reports whether it took them and, if not, how long until it could
// (InfDuration when n is above Capacity or negative).
func (b *Bucket) TakeNow(now Instant, n int64) (wait time.Duration, ok bool) {
	b.Advance(now)
	if w := b.Wait(n); w > 0 {
		return w, false
	}
	b.Take(n)
	return 0, true
}

// ReserveAhead advances to now and reserves n tokens for the earliest
// instant they are covered, returning the wait until then (0 for now). The
// tokens are taken at once, so the level may go negative and later callers
// see the reservation. When the wait would exceed maxWait it reserves
// nothing and reports false with the wait that would have been needed.
func (b *Bucket) ReserveAhead(now Instant, n int64, maxWait time.Duration) (wait time.Duration, ok bool) {
	b.Advance(now)
	w := b.Wait(n)
	if w > maxWait {
		return w, false
	}
	b.Take(n)
	return w, true
}

// Charge advances to now and takes n tokens with no floor: an overrun
// reported after the fact becomes debt that later requests wait off.
func (b *Bucket) Charge(now Instant, n int64) {
	b.Advance(now)
	b.Take(n)
}

// SetLimit makes the bucket follow a new limit without minting tokens: it
// refills to now under the old limit, keeps the level (rounded down to the
// new fixed-point scale) and caps it at the new capacity. The refill from
// now on runs at the new rate. An invalid limit changes nothing.
func (b *Bucket) SetLimit(l Limit, now Instant) error {
	if l == b.lim {
		return nil
	}
	if err := l.Validate(); err != nil {
		return err
	}
	b.Advance(now)
	oldScale := b.scale
	b.setParams(l)
	b.level = mulDivFloor(b.level, b.scale, oldScale)
	if b.level > b.full {
		b.level = b.full
	}
	if b.level < -MaxScaled {
		b.level = -MaxScaled
	}
	return nil
}

// mulDivFloor returns floor(a*m/d) for m, d > 0, saturating at ±2*MaxScaled.
func mulDivFloor(a, m, d int64) int64 {
	neg := a < 0
	ua := uint64(a)
	if neg {
		ua = uint64(-a)
	}
	hi, lo := bits.Mul64(ua, uint64(m))
	if hi >= uint64(d) {
		if neg {
			return -2 * MaxScaled
		}
		return 2 * MaxScaled
	}
	q, r := bits.Div64(hi, lo, uint64(d))
	if q > 2*MaxScaled {
		q = 2 * MaxScaled
	}
	if neg {
		if r != 0 {
			q++
		}
		return -int64(q)
	}
	return int64(q)
}

func ceilDiv(a, b int64) int64 {
	if b == 1 { // the usual increment: most per-minute limits divide 60e6 µs
		return a
	}
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}
