package cluster

import (
	"fmt"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
)

// durableKeys: the 64 keys of BenchmarkFailover's calls (this package's
// tests cannot import package allocator, which imports this one; the
// journal-against-cluster benchmark is allocator's BenchmarkDurableAcquire).
// Limits are high enough that every key is granted; amounts are a
// gateway's: it holds 10 requests / 4,000 tokens and asks for as much
// again, spending 600 / 240,000 a minute.
func durableKeys() []ledger.AcquireKey {
	keys := make([]ledger.AcquireKey, 64)
	for i := range keys {
		keys[i] = ledger.AcquireKey{Key: fmt.Sprintf("team-%02d/model-%03d", i%8, i),
			Limits:    ration.Limits{RPM: 1_000_000_000, TPM: 1_000_000_000_000},
			Want:      ration.Amount{Requests: 10, Tokens: 4_000},
			Held:      ration.Amount{Requests: 10, Tokens: 4_000},
			SpendRate: ration.Amount{Requests: 600, Tokens: 240_000}}
	}
	return keys
}
