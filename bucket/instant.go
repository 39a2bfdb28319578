package bucket

import "time"

// Instant is a point in time in whole microseconds since an epoch chosen by
// the bucket's owner. Instants from different epochs must not be mixed.
type Instant int64

// InstantOf returns t as an Instant relative to epoch, rounded down to the
// microsecond (also before the epoch). It uses the monotonic clock reading
// when both times carry one.
func InstantOf(epoch, t time.Time) Instant {
	d := t.Sub(epoch)
	us := d / time.Microsecond
	if d < 0 && d%time.Microsecond != 0 {
		us--
	}
	return Instant(us)
}

// Time returns the wall-clock time of i relative to epoch.
func (i Instant) Time(epoch time.Time) time.Time {
	return epoch.Add(time.Duration(i) * time.Microsecond)
}

// Add returns i+d, with d rounded up to the next microsecond, saturating
// instead of overflowing.
func (i Instant) Add(d time.Duration) Instant {
	us := int64(d / time.Microsecond)
	if d%time.Microsecond > 0 {
		us++
	}
	if us > 0 && int64(i) > 1<<63-1-us {
		return Instant(1<<63 - 1)
	}
	if us < 0 && int64(i) < -1<<63-us {
		return Instant(-1 << 63)
	}
	return i + Instant(us)
}

// Sub returns the duration i-j, saturating at the bounds of time.Duration.
func (i Instant) Sub(j Instant) time.Duration {
	return micros(int64(i) - int64(j))
}

// micros converts a count of microseconds to a Duration, saturating at
// InfDuration (and its negative).
func micros(us int64) time.Duration {
	const max = int64(InfDuration / time.Microsecond)
	switch {
	case us > max:
		return InfDuration
	case us < -max:
		return -InfDuration
	}
	return time.Duration(us) * time.Microsecond
}
