package bucket

import (
	"math/bits"
	"time"
)

// AdvanceFraction refills the bucket to now at num/den of its refill rate,
// rounded down to the unit, for an owner that hands the rest of the refill
// out elsewhere (an allocator's refill shares). num >= den is Advance;
// num = 0 only moves the refill instant. den must be positive.
//
// A gap so long that the full rate's refill exceeds 2^63 units counts as
// 2^63 units of it: less than the truth, never more.
func (b *Bucket) AdvanceFraction(now Instant, num, den uint64) {
	if num >= den {
		b.Advance(now)
		return
	}
	if now <= b.last {
		return
	}
	dt := uint64(now) - uint64(b.last)
	b.last = now
	need := uint64(b.full - b.level)
	if need == 0 || num == 0 {
		return
	}
	hi, lo := bits.Mul64(dt, uint64(b.inc))
	if hi != 0 || lo > 1<<63 {
		lo = 1 << 63
	}
	hi, lo = bits.Mul64(lo, num)
	q, _ := bits.Div64(hi, lo, den) // hi < den: lo·num/den < 2^63
	if q >= need {
		b.level = b.full
		return
	}
	b.level += int64(q)
}

// WaitFraction is Wait for a bucket that refills at num/den of its rate (see
// AdvanceFraction): InfDuration when n is above Capacity, or when the level
// does not cover n and num is 0. den must be positive.
func (b *Bucket) WaitFraction(n int64, num, den uint64) time.Duration {
	if num >= den {
		return b.Wait(n)
	}
	if !b.Fits(n) {
		return InfDuration
	}
	deficit := n*b.scale - b.level
	if deficit <= 0 {
		return 0
	}
	if num == 0 {
		return InfDuration
	}
	// ceil(deficit × den / (inc × num)) microseconds.
	rh, rate := bits.Mul64(uint64(b.inc), num)
	if rh != 0 {
		return time.Microsecond // refills more than any deficit in a microsecond
	}
	hi, lo := bits.Mul64(uint64(deficit), den)
	if hi >= rate {
		return InfDuration
	}
	q, r := bits.Div64(hi, lo, rate)
	if r != 0 {
		q++
	}
	if q > uint64(InfDuration/time.Microsecond) {
		return InfDuration
	}
	return micros(int64(q))
}
