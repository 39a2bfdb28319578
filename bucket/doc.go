// Package bucket is ration's one token-bucket implementation: exact integer
// arithmetic shared by the allocator, the spender and the simulator.
//
// A [Bucket] holds at most Capacity tokens and refills continuously at
// Refill tokens per Period, capped at Capacity; it starts full. Capacity
// (the burst) and the refill rate are independent knobs. The default for a
// per-minute limit C is [PerMinute](C): capacity C, refilled C per minute.
//
// # Exactness
//
// The level is stored in fixed point: one token is Scale units, where
// Scale = Period/g microseconds and g = gcd(Refill, Period in microseconds),
// so one microsecond of refill adds exactly Refill/g units. Every refill,
// take, give and wait is an integer operation on that scale; nothing is
// rounded except where the API says so (waits round up to the next
// microsecond, token counts shown to clients round down). Sums telescope:
// a million operations land on the same level as one big one. This is seed
// 002's "seconds of refill" generalised to any rate.
//
// Time is an [Instant]: whole microseconds since an epoch the bucket's owner
// chooses (the spender uses process start on the monotonic clock, the
// allocator the Unix epoch). The package never reads a clock.
//
// # Negative levels
//
// The level may go below zero: an overrun charged after the fact ([Bucket.Take])
// and a wait-mode reservation ([Bucket.ReserveAhead]) both leave debt that
// later refill pays off. Debt saturates at -[MaxScaled] units rather than
// overflowing.
//
// # Caveats
//
// A Bucket is a value with no lock: its owner serialises access (the spender
// shards keys over mutexes, the allocator runs one writer per key). A clock
// that steps backwards adds nothing and does not move the bucket's notion of
// "last refill", so stepping back and forth cannot mint tokens.
package bucket
