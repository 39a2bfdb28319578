package ledger

import (
	"errors"
	"fmt"
	"math/bits"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
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
	case len(c.Credential) > MaxCredentialLen:
		return inputErr("caller.credential", "%d bytes, at most %d", len(c.Credential), MaxCredentialLen)
	}
	return nil
}

func keyField(i int, name string) string { return fmt.Sprintf("keys[%d].%s", i, name) }

func validateAmount(i int, name string, a ration.Amount) error {
	if a.Requests < 0 || a.Requests > ration.MaxAmount {
		return inputErr(keyField(i, name)+".requests", "%d outside [0, %d]", a.Requests, int64(ration.MaxAmount))
	}
	if a.Tokens < 0 || a.Tokens > ration.MaxAmount {
		return inputErr(keyField(i, name)+".tokens", "%d outside [0, %d]", a.Tokens, int64(ration.MaxAmount))
	}
	return nil
}

func validateLimits(i int, l ration.Limits) error {
	err := l.Validate()
	if err == nil {
		return nil
	}
	var le *ration.LimitsError
	if errors.As(err, &le) {
		return inputErr(keyField(i, "limits")+"."+le.Field, "%s", le.Reason)
	}
	return err
}

// validateKeys checks what every call shares: the caller, the batch size,
// each key's name and limits, and that no key appears twice.
func validateKeys(c Caller, n int, allowEmpty bool, keyAt func(i int) (string, ration.Limits)) error {
	if err := validateCaller(c); err != nil {
		return err
	}
	if n == 0 && !allowEmpty {
		return inputErr("keys", "empty batch")
	}
	if n > ration.MaxBatch {
		return inputErr("keys", "%d entries, at most %d", n, ration.MaxBatch)
	}
	// Duplicates are found through an open-addressing table of key
	// indexes, at most half full: no map to allocate per call. A table for
	// up to 64 keys lives on the stack; one for all of MaxBatch there (4 KB)
	// made every RPC's fresh handler goroutine grow and copy its stack.
	mask := uint64(1)<<bits.Len(uint(2*max(n, 1)-1)) - 1 // a power of two, at least 2n
	var small [128]int16                                 // key index + 1; 0: free
	seen := small[:]
	if mask >= uint64(len(small)) {
		seen = make([]int16, mask+1)
	}
	for i := range n {
		name, lim := keyAt(i)
		if err := ration.ValidKey(name); err != nil {
			return inputErr(keyField(i, "key"), "%v", err)
		}
		h := fnv1a(name) & mask
		for ; seen[h] != 0; h = (h + 1) & mask {
			if j := int(seen[h]) - 1; name == keyNameAt(keyAt, j) {
				return inputErr(keyField(i, "key"), "duplicates keys[%d].key", j)
			}
		}
		seen[h] = int16(i + 1)
		if err := validateLimits(i, lim); err != nil {
			return err
		}
	}
	return nil
}

func keyNameAt(keyAt func(i int) (string, ration.Limits), i int) string {
	name, _ := keyAt(i)
	return name
}

// fnv1a is the 64-bit FNV-1a hash of s.
func fnv1a(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}

func validateAcquire(c Caller, keys []AcquireKey) error {
	if err := validateKeys(c, len(keys), false, func(i int) (string, ration.Limits) { return keys[i].Key, keys[i].Limits }); err != nil {
		return err
	}
	for i := range keys {
		k := &keys[i]
		if inRange(k.Want) && inRange(k.Need) && inRange(k.SpendRate) && inRange(k.Returned) && inRange(k.Held) && inRange(k.Debt) && inRange(k.Demand) {
			continue // the common case, without naming the fields
		}
		for _, a := range []struct {
			name string
			v    ration.Amount
		}{{"want", k.Want}, {"need", k.Need}, {"spend_rate", k.SpendRate}, {"returned", k.Returned}, {"held", k.Held}, {"debt", k.Debt}, {"demand", k.Demand}} {
			if err := validateAmount(i, a.name, a.v); err != nil {
				return err
			}
		}
	}
	return nil
}

// inRange reports whether both of a's fields are within [0, MaxAmount]
// (validateAmount's check).
func inRange(a ration.Amount) bool {
	return uint64(a.Requests) <= ration.MaxAmount && uint64(a.Tokens) <= ration.MaxAmount
}

func validateReserve(c Caller, keys []ReserveKey) error {
	if err := validateKeys(c, len(keys), false, func(i int) (string, ration.Limits) { return keys[i].Key, keys[i].Limits }); err != nil {
		return err
	}
	for i, k := range keys {
		if err := validateAmount(i, "cost", k.Cost); err != nil {
			return err
		}
		if k.MaxWait < 0 || k.MaxWait > ration.MaxWait {
			// The wire value was clamped on its way in: name the range, not it.
			return inputErr(keyField(i, "max_wait_us"), "must be 0 to %d µs (%v)", int64(ration.MaxWait/time.Microsecond), ration.MaxWait)
		}
	}
	return nil
}

func validateRelease(c Caller, keys []ReleaseKey) error {
	if err := validateKeys(c, len(keys), true, func(i int) (string, ration.Limits) { return keys[i].Key, keys[i].Limits }); err != nil {
		return err
	}
	for i, k := range keys {
		if err := validateAmount(i, "returned", k.Returned); err != nil {
			return err
		}
		if err := validateAmount(i, "debt", k.Debt); err != nil {
			return err
		}
	}
	return nil
}

// validateEpoch refuses an epoch beyond maxEpoch(now).
func validateEpoch(c Caller, now bucket.Instant) error {
	if limit := maxEpoch(now); c.Epoch > limit {
		return inputErr("caller.epoch", "%d is more than %v past the allocator's clock (%d, in nanoseconds since the Unix epoch)",
			c.Epoch, ration.MaxEpochAhead, limit)
	}
	return nil
}

// maxEpoch is the highest epoch a call at now may carry: now in
// nanoseconds since the Unix epoch, plus ration.MaxEpochAhead. So an id's
// epoch can be pushed no further than a day past the allocator's clock,
// and a successor starting one above it is accepted.
func maxEpoch(now bucket.Instant) uint64 {
	return uint64(max(now, 0))*uint64(time.Microsecond) + uint64(ration.MaxEpochAhead)
}

// Validate returns the error State.Apply would return for cmd's input
// (an error wrapping ErrInvalidArgument that names the field), or nil. It
// depends on cmd alone (its Now bounds the epoch), not on any state, so a
// proposer can refuse bad input before it becomes a log entry; Apply
// checks again. A command validated at one Now is valid at any later one.
func Validate(cmd Command) error {
	var err error
	switch c := cmd.(type) {
	case Acquire:
		if err = validateAcquire(c.Caller, c.Keys); err == nil {
			err = validateEpoch(c.Caller, c.Now)
		}
	case ReserveAhead:
		if err = validateReserve(c.Caller, c.Keys); err == nil {
			err = validateEpoch(c.Caller, c.Now)
		}
	case Release:
		if err = validateRelease(c.Caller, c.Keys); err == nil {
			err = validateEpoch(c.Caller, c.Now)
		}
	case Sweep:
		if c.Parts > 1 && c.Part >= c.Parts {
			err = inputErr("part", "%d of %d parts", c.Part, c.Parts)
		}
	default:
		err = fmt.Errorf("allocator: unknown command %T", cmd)
	}
	return err
}
