package allocator

import (
	"errors"
	"hash/maphash"
	"sync"

	"github.com/rationhq/ration"
)

func validateCaller(c Caller) error {
	switch {
	case c.SpenderID == "":
		return inputErr("caller.spender_id", "empty")
	case len(c.SpenderID) > ration.MaxSpenderIDLen:
		return inputErr("caller.spender_id", "%d bytes, at most %d", len(c.SpenderID), ration.MaxSpenderIDLen)
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
	if n > ration.MaxBatch {
		return inputErr("keys", "%d entries, at most %d", n, ration.MaxBatch)
	}
	return nil
}

func validateKey(i int, k string) error {
	if err := ration.ValidKey(k); err != nil {
		return inputErr(fieldIdx("keys", i, "key"), "%v", err)
	}
	return nil
}

func validateAmount(i int, name string, a ration.Amount) error {
	if a.Requests < 0 || a.Requests > ration.MaxAmount {
		return inputErr(fieldIdx("keys", i, name)+".requests", "%d outside [0, %d]", a.Requests, int64(ration.MaxAmount))
	}
	if a.Tokens < 0 || a.Tokens > ration.MaxAmount {
		return inputErr(fieldIdx("keys", i, name)+".tokens", "%d outside [0, %d]", a.Tokens, int64(ration.MaxAmount))
	}
	return nil
}

func validateLimits(i int, l ration.Limits) error {
	var le *ration.LimitsError
	if err := l.Validate(); errors.As(err, &le) {
		return inputErr(fieldIdx("keys", i, "limits")+"."+le.Field, "%s", le.Reason)
	}
	return nil
}

// dupTables holds the hash tables of checkDuplicates.
var dupTables = sync.Pool{New: func() any { return new([2 * ration.MaxBatch]uint16) }}

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
	tp := dupTables.Get().(*[2 * ration.MaxBatch]uint16)
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
func validateCall(c Caller, n int, allowEmpty bool, keyAt func(i int) (string, ration.Limits), each func(i int) error) error {
	if err := validateCaller(c); err != nil {
		return err
	}
	if err := validateBatch(n, allowEmpty); err != nil {
		return err
	}
	var prev ration.Limits
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
	return validateCall(c, len(keys), false, func(i int) (string, ration.Limits) { return keys[i].Key, keys[i].Limits }, func(i int) error {
		k := &keys[i]
		// MaxAmount is a power of two: if the OR of every amount, as
		// unsigned, is below it, each is in [0, MaxAmount). Otherwise the
		// field-by-field check decides (and names the field).
		if uint64(k.Want.Requests|k.Want.Tokens|k.Need.Requests|k.Need.Tokens|k.SpendRate.Requests|k.SpendRate.Tokens|
			k.Returned.Requests|k.Returned.Tokens|k.Held.Requests|k.Held.Tokens|k.Debt.Requests|k.Debt.Tokens) < ration.MaxAmount {
			return nil
		}
		for _, a := range []struct {
			name string
			v    ration.Amount
		}{{"want", k.Want}, {"need", k.Need}, {"spend_rate", k.SpendRate}, {"returned", k.Returned}, {"held", k.Held}, {"debt", k.Debt}} {
			if err := validateAmount(i, a.name, a.v); err != nil {
				return err
			}
		}
		return nil
	})
}

func validateReserve(c Caller, keys []ReserveKey) error {
	return validateCall(c, len(keys), false, func(i int) (string, ration.Limits) { return keys[i].Key, keys[i].Limits }, func(i int) error {
		k := &keys[i]
		if err := validateAmount(i, "cost", k.Cost); err != nil {
			return err
		}
		if k.MaxWait < 0 || k.MaxWait > ration.MaxWait {
			return inputErr(fieldIdx("keys", i, "max_wait_us"), "%v outside [0, %v]", k.MaxWait, ration.MaxWait)
		}
		return nil
	})
}

func validateRelease(c Caller, keys []ReleaseKey) error {
	return validateCall(c, len(keys), true, func(i int) (string, ration.Limits) { return keys[i].Key, keys[i].Limits }, func(i int) error {
		if err := validateAmount(i, "returned", keys[i].Returned); err != nil {
			return err
		}
		return validateAmount(i, "debt", keys[i].Debt)
	})
}
