package ledger_test

import (
	"flag"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/ledger"
)

// memKeys is how many keys BenchmarkStateMemory builds.
var memKeys = flag.Int("mem.keys", 100_000, "keys BenchmarkStateMemory builds")

// heapAfterGC is the live heap, in bytes, after a full collection.
func heapAfterGC() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// BenchmarkStateMemory measures what the ledger's state costs in memory
// (docs/performance.md, "Allocator cluster"; docs/cluster.md, "Capacity"):
// the live heap of a ledger.State holding -mem.keys keys, each held by 1,
// then by 8 spenders, as Acquire calls of 64 keys build it (each call
// also leaves its spender's session, with the stored reply of its last
// call), then 1,000 more spenders that each make one 64-key call on 64
// keys of their own. It reports, from heap differences after a full GC:
//
//	B/key        a key with one holding (the key's buckets, its name and
//	             map entry, one holding)
//	B/holding    each further (key, spender) holding, up to 8 (a key's
//	             holdings are one slice, grown by append: 8 fill it)
//	B/session    a spender's session with a 64-key stored reply, less
//	             its 64 new keys at B/key
//
// It is a measurement, not a check: it runs once per b.N loop and only
// under -bench.
func BenchmarkStateMemory(b *testing.B) {
	const batch, holders, sessions = 64, 8, 1000
	lim := ration.Limits{RPM: 600, TPM: 100_000}
	want := ration.Amount{Requests: 1, Tokens: 100}
	for range b.N {
		b.StopTimer()
		st, err := ledger.New(ledger.Config{TTL: 10 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		keys := make([]string, *memKeys)
		for i := range keys {
			keys[i] = fmt.Sprintf("key-%07d", i) // 11 bytes, as short ids are
		}
		now := ledger.InstantOf(time.Unix(1_800_000_000, 0))
		call := func(spender string, seq uint64, ks []string) {
			aks := make([]ledger.AcquireKey, len(ks))
			for i, k := range ks {
				aks[i] = ledger.AcquireKey{Key: k, Limits: lim, Want: want, SpendRate: want}
			}
			cmd := ledger.Acquire{Now: now, Caller: ledger.Caller{SpenderID: spender, Epoch: 1, Sequence: seq}, Keys: aks}
			if _, _, err := st.Apply(cmd); err != nil {
				b.Fatal(err)
			}
		}
		holdAll := func(spender string) {
			for i := 0; i < len(keys); i += batch {
				call(spender, uint64(i/batch+1), keys[i:min(i+batch, len(keys))])
			}
			now = now.Add(time.Millisecond)
		}
		b.StartTimer()
		h0 := heapAfterGC()
		holdAll("gw-0")
		h1 := heapAfterGC()
		for s := 1; s < holders; s++ {
			holdAll(fmt.Sprint("gw-", s))
		}
		h8 := heapAfterGC()
		fresh := make([]string, batch)
		for s := range sessions {
			for i := range fresh {
				fresh[i] = fmt.Sprintf("x%03d-%06d", i, s) // as long as keys[i]
			}
			call(fmt.Sprint("extra-", s), 1, fresh)
		}
		hs := heapAfterGC()
		b.StopTimer()
		if stats := st.Stats(); stats.Keys != len(keys)+sessions*batch || stats.Holdings != holders*len(keys)+sessions*batch {
			b.Fatalf("state has %+v; want %d keys and %d holdings", stats, len(keys)+sessions*batch, holders*len(keys)+sessions*batch)
		}
		perKey := float64(h1-h0) / float64(len(keys))
		b.ReportMetric(perKey, "B/key")
		b.ReportMetric(float64(h8-h1)/float64((holders-1)*len(keys)), "B/holding")
		b.ReportMetric((float64(hs-h8)-perKey*sessions*batch)/sessions, "B/session")
		b.ReportMetric(float64(hs-h0)/(1<<20), "MiB-total")
		runtime.KeepAlive(st)
	}
}
