package allocator

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/rationhq/ration/bucket"
)

// Input bounds. Requests outside them get ErrInvalidArgument.
const (
	MaxKeyLen       = 256               // bytes in a key
	MaxSpenderIDLen = 128               // bytes in a spender id
	MaxBatch        = 1024              // keys in one call
	MaxRate         = 1_000_000_000_000 // requests or tokens per minute, and bursts
	MaxAmount       = 1 << 50           // any amount in a call
	MaxWait         = time.Hour         // ReserveKey.MaxWait
)

func validateCaller(c Caller) error {
	switch {
	case c.SpenderID == "":
		return inputErr("caller.spender_id", "empty")
	case len(c.SpenderID) > MaxSpenderIDLen:
		return inputErr("caller.spender_id", "%d bytes, at most %d", len(c.SpenderID), MaxSpenderIDLen)
	case c.Epoch == 0:
		return inputErr("caller.epoch", "must be positive")
	case c.Sequence == 0:
		return inputErr("caller.sequence", "must be positive")
	}
	return nil
}

func validateBatch(n int, allowEmpty bool) error {
	if n == 0 && !allowEmpty {
		return inputErr("keys", "empty batch")
	}
	if n > MaxBatch {
		return inputErr("keys", "%d entries, at most %d", n, MaxBatch)
	}
	return nil
}

func validateKey(i int, k string) error {
	if k == "" {
		field := fieldIdx("keys", i, "key")
		return inputErr(field, "empty")
	}
	if len(k) > MaxKeyLen {
		return inputErr(fieldIdx("keys", i, "key"), "%d bytes, at most %d", len(k), MaxKeyLen)
	}
	return nil
}

func validateAmount(i int, name string, a Amount) error {
	if a.Requests < 0 || a.Requests > MaxAmount {
		return inputErr(fieldIdx("keys", i, name)+".requests", "%d outside [0, %d]", a.Requests, int64(MaxAmount))
	}
	if a.Tokens < 0 || a.Tokens > MaxAmount {
		return inputErr(fieldIdx("keys", i, name)+".tokens", "%d outside [0, %d]", a.Tokens, int64(MaxAmount))
	}
	return nil
}

func validateLimits(i int, l Limits) error {
	check := func(name string, v int64) error {
		if v < 0 || v > MaxRate {
			return inputErr(fieldIdx("keys", i, "limits")+"."+name, "%d outside [0, %d]", v, int64(MaxRate))
		}
		return nil
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"rpm", l.RPM}, {"tpm", l.TPM}, {"burst_requests", l.BurstRequests}, {"burst_tokens", l.BurstTokens}} {
		if err := check(f.name, f.v); err != nil {
			return err
		}
	}
	if lim, ok := dimLimit(l.RPM, l.BurstRequests); ok {
		if err := lim.Validate(); err != nil {
			return inputErr(fieldIdx("keys", i, "limits")+".rpm", "%v", err)
		}
	}
	if lim, ok := dimLimit(l.TPM, l.BurstTokens); ok {
		if err := lim.Validate(); err != nil {
			return inputErr(fieldIdx("keys", i, "limits")+".tpm", "%v", err)
		}
	}
	return nil
}

// dimLimit returns the bucket for one dimension and whether it is limited.
func dimLimit(rate, burst int64) (bucket.Limit, bool) {
	if rate == 0 {
		return bucket.Limit{}, false
	}
	c := burst
	if c == 0 {
		c = rate
	}
	return bucket.Limit{Capacity: c, Refill: rate, Period: time.Minute}, true
}

// dupTables holds the hash tables of checkDuplicates.
var dupTables = sync.Pool{New: func() any { return new([2 * MaxBatch]uint16) }}

// dupSeed seeds checkDuplicates' hash, per process, so that no caller can
// precompute keys that collide in its table (a batch of them would make
// the scan quadratic).
var dupSeed = maphash.MakeSeed()

// checkDuplicates finds a key listed twice in one batch without
// allocating: small batches by a quadratic scan, larger ones with an
// open-addressing table of key indexes (+1; 0 = empty) at most half full,
// pooled rather than on the stack (a 4 KB array made every handler
// goroutine grow its stack on its first call).
func checkDuplicates(n int, key func(int) string) error {
	if n <= 16 {
		for i := 1; i < n; i++ {
			for j := 0; j < i; j++ {
				if key(i) == key(j) {
					return inputErr(fieldIdx("keys", i, "key"), "duplicates keys[%d].key", j)
				}
			}
		}
		return nil
	}
	size := 64
	for size < 2*n {
		size <<= 1
	}
	tp := dupTables.Get().(*[2 * MaxBatch]uint16)
	defer dupTables.Put(tp)
	t := tp[:size]
	clear(t)
	mask := uint64(size - 1)
	for i := range n {
		k := key(i)
		for s := maphash.String(dupSeed, k) & mask; ; s = (s + 1) & mask {
			j := int(t[s]) - 1
			if j < 0 {
				t[s] = uint16(i + 1)
				break
			}
			if key(j) == k {
				return inputErr(fieldIdx("keys", i, "key"), "duplicates keys[%d].key", j)
			}
		}
	}
	return nil
}

func fieldIdx(list string, i int, name string) string {
	return list + "[" + itoa(i) + "]." + name
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b [20]byte
	p := len(b)
	for i > 0 {
		p--
		b[p] = byte('0' + i%10)
		i /= 10
	}
	return string(b[p:])
}

// validateCall checks what every call shares: the caller, the batch size,
// each key's name and limits (a key with the same limits as the one before
// passed already: the check is a pure function of them), the call's own
// per-key fields (each), and that no key appears twice.
func validateCall(c Caller, n int, allowEmpty bool, keyAt func(i int) (string, Limits), each func(i int) error) error {
	if err := validateCaller(c); err != nil {
		return err
	}
	if err := validateBatch(n, allowEmpty); err != nil {
		return err
	}
	var prev Limits
	for i := range n {
		name, lim := keyAt(i)
		if err := validateKey(i, name); err != nil {
			return err
		}
		if i == 0 || lim != prev {
			if err := validateLimits(i, lim); err != nil {
				return err
			}
		}
		prev = lim
		if err := each(i); err != nil {
			return err
		}
	}
	return checkDuplicates(n, func(i int) string { name, _ := keyAt(i); return name })
}

func validateAcquire(c Caller, keys []AcquireKey) error {
	return validateCall(c, len(keys), false, func(i int) (string, Limits) { return keys[i].Key, keys[i].Limits }, func(i int) error {
		k := &keys[i]
		// MaxAmount is a power of two: if the OR of every amount, as
		// unsigned, is below it, each is in [0, MaxAmount). Otherwise the
		// field-by-field check decides (and names the field).
		if uint64(k.Want.Requests|k.Want.Tokens|k.Need.Requests|k.Need.Tokens|k.SpendRate.Requests|k.SpendRate.Tokens|
			k.Returned.Requests|k.Returned.Tokens|k.Held.Requests|k.Held.Tokens|k.Debt.Requests|k.Debt.Tokens) < MaxAmount {
			return nil
		}
		for _, a := range []struct {
			name string
			v    Amount
		}{{"want", k.Want}, {"need", k.Need}, {"spend_rate", k.SpendRate}, {"returned", k.Returned}, {"held", k.Held}, {"debt", k.Debt}} {
			if err := validateAmount(i, a.name, a.v); err != nil {
				return err
			}
		}
		return nil
	})
}

func validateReserve(c Caller, keys []ReserveKey) error {
	return validateCall(c, len(keys), false, func(i int) (string, Limits) { return keys[i].Key, keys[i].Limits }, func(i int) error {
		k := &keys[i]
		if err := validateAmount(i, "cost", k.Cost); err != nil {
			return err
		}
		if k.MaxWait < 0 || k.MaxWait > MaxWait {
			return inputErr(fieldIdx("keys", i, "max_wait_us"), "%v outside [0, %v]", k.MaxWait, MaxWait)
		}
		return nil
	})
}

func validateRelease(c Caller, keys []ReleaseKey) error {
	return validateCall(c, len(keys), true, func(i int) (string, Limits) { return keys[i].Key, keys[i].Limits }, func(i int) error {
		if err := validateAmount(i, "returned", keys[i].Returned); err != nil {
			return err
		}
		return validateAmount(i, "debt", keys[i].Debt)
	})
}
