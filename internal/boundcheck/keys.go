package boundcheck

import (
	"fmt"
	"time"

	"github.com/rationhq/ration"
)

// Key is one key the model spenders use, with its limits.
type Key struct {
	Name   string
	Limits ration.Limits
}

// NumKeys is the number of keys in Keys.
const NumKeys = 3

// Keys returns the model's keys: one with requests and tokens limited per
// minute, one with a token burst above the per-minute rate, and one whose
// window is an hour (20 requests a minute, with an hour's burst).
func Keys() [NumKeys]Key {
	return [NumKeys]Key{
		{"k0", ration.Limits{RPM: 60, TPM: 600}},
		{"k1", ration.Limits{RPM: 30, TPM: 120, BurstTokens: 200}},
		{"k2", ration.Limits{RPM: 1200, TPM: 48_000, Window: time.Hour}}, // 20 a minute, with an hour's burst
	}
}

// TTL is the lease time to live the ledger under test must be configured
// with: the model's leases and the bound's TTL term.
const TTL = 10 * time.Second

// keyIndex returns the index in Keys of the key named name.
func keyIndex(name string) int {
	for i, k := range Keys() {
		if k.Name == name {
			return i
		}
	}
	panic(fmt.Sprintf("boundcheck: unknown key %q", name))
}
