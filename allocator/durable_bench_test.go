package allocator_test

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/allocator/cluster"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/internal/testkit"
)

// Durable Acquire: today's journal (allocator.Open: bbolt, group commit,
// fsync on) against a one-member cluster (raft-boltdb, fsync on, file
// snapshots), both answering once the call is durable. Run them
// interleaved, one binary (docs/performance.md, "Allocator cluster"):
//
//	go test -c -o /tmp/allocator.test ./allocator
//	/tmp/allocator.test -test.run '^$' -test.bench 'DurableAcquire/journal$' -test.benchtime 5s
//	/tmp/allocator.test -test.run '^$' -test.bench 'DurableAcquire/replicated$' -test.benchtime 5s
//
// The cluster runs two ways: raft1 calls cluster.Node.Apply directly, one
// command per log entry (raft's leader loop takes every entry waiting on
// its apply channel, up to MaxAppendEntries, and stores them with one
// StoreLogs, one bbolt transaction and one fsync); replicated is the
// wired path, allocator.NewReplicated, whose group commit puts the calls
// that arrive during an entry's commit into the next entry, one at a
// time, with the journal's linger. calls/commit reports the grouping for
// all of them.

// benchCallers: concurrent callers, as gateways would be.
var benchCallers = flag.Int("durable.callers", 8, "BenchmarkDurableAcquire: concurrent callers")

// runCallers makes b.N Acquire calls from *benchCallers goroutines, each
// a spender of its own ("gateway-0", "gateway-1", ...; epoch 1, sequence
// 1, 2, ...): newCaller(id) is made for each before the timer starts, and
// returns the function that makes that spender's call with a given
// sequence.
func runCallers(b *testing.B, newCaller func(id string) func(seq uint64) error) {
	calls := make([]func(uint64) error, *benchCallers)
	for g := range calls {
		calls[g] = newCaller(fmt.Sprintf("gateway-%d", g))
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	cpu0 := testkit.CPUTime()
	b.ResetTimer()
	for _, call := range calls {
		wg.Go(func() {
			for seq := uint64(1); next.Add(1) <= int64(b.N); seq++ {
				if err := call(seq); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	s := b.Elapsed().Seconds()
	b.ReportMetric(float64(b.N)/s, "calls/s")
	b.ReportMetric(float64((testkit.CPUTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/call")
}

// ledgerCalls adapts call, which takes a ledger call, to runCallers. Every
// call acquires the same 64 keys (the gateways share their keys'
// budgets), all granted.
func ledgerCalls(call func(c ledger.Caller, keys []ledger.AcquireKey) error) func(string) func(uint64) error {
	keys := benchKeys(64, "durable")
	return func(id string) func(uint64) error {
		return func(seq uint64) error {
			return call(ledger.Caller{SpenderID: id, Epoch: 1, Sequence: seq}, keys)
		}
	}
}

// countingLogs counts the leader's log writes (one fsync each).
type countingLogs struct {
	*raftboltdb.BoltStore
	writes, nanos atomic.Int64
}

func (c *countingLogs) StoreLogs(logs []*raft.Log) error {
	start := time.Now()
	err := c.BoltStore.StoreLogs(logs)
	c.writes.Add(1)
	c.nanos.Add(int64(time.Since(start)))
	return err
}

func (c *countingLogs) StoreLog(l *raft.Log) error { return c.StoreLogs([]*raft.Log{l}) }

// openJournal opens today's journal, as cmd/allocator runs it without
// cluster flags (allocator.Open in a temp dir: bbolt, fsync on, the group
// commit with the default 8 ms linger), with opts; it is closed when b
// ends. report adds the commits' calls/commit and ms/commit since then.
func openJournal(b *testing.B, opts ...allocator.Option) (l *allocator.Ledger, report func()) {
	var commits, nanos atomic.Int64
	opts = append(opts, allocator.WithCommitObserver(func(d time.Duration, _ error) {
		commits.Add(1)
		nanos.Add(int64(d))
	}))
	l, err := allocator.Open(filepath.Join(b.TempDir(), "ledger.db"), opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	c0, n0 := commits.Load(), nanos.Load()
	return l, func() {
		if n := commits.Load() - c0; n > 0 {
			b.ReportMetric(float64(b.N)/float64(n), "calls/commit")
			b.ReportMetric(float64(nanos.Load()-n0)/float64(n)/1e6, "ms/commit")
		}
	}
}

// BenchmarkDurableAcquire: see the top of the file.
func BenchmarkDurableAcquire(b *testing.B) {
	// journal: cmd/allocator's default commit linger (8 ms);
	// journal-linger0: no linger, as raft's leader loop has none.
	for _, name := range []string{"journal", "journal-linger0"} {
		b.Run(name, func(b *testing.B) {
			var opts []allocator.Option
			if name == "journal-linger0" {
				opts = append(opts, allocator.WithCommitLinger(0))
			}
			l, report := openJournal(b, opts...)
			runCallers(b, ledgerCalls(func(c ledger.Caller, keys []ledger.AcquireKey) error {
				_, err := l.Acquire(context.Background(), c, keys)
				return err
			}))
			report()
		})
	}
	b.Run("raft1", func(b *testing.B) {
		dir := b.TempDir()
		bs, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db")) // fsync on
		if err != nil {
			b.Fatal(err)
		}
		defer bs.Close()
		logs := &countingLogs{BoltStore: bs}
		_, tr := raft.NewInmemTransport("one")
		// raft's defaults (heartbeat and election 1 s, lease 500 ms, commit
		// timeout 50 ms, MaxAppendEntries 64, snapshot threshold 8,192
		// entries checked every 120 s).
		nd, err := cluster.New("one", tr, ledger.Config{TTL: 10 * time.Second}, cluster.WithStores(logs, bs), cluster.WithFileSnapshots(filepath.Join(dir, "snaps"), 2))
		if err != nil {
			b.Fatal(err)
		}
		defer nd.Shutdown()
		if err := nd.Bootstrap(raft.Server{ID: nd.ID(), Address: nd.Addr()}); err != nil {
			b.Fatal(err)
		}
		awaitLeader(b, nd)
		w0, n0 := logs.writes.Load(), logs.nanos.Load()
		runCallers(b, ledgerCalls(func(c ledger.Caller, keys []ledger.AcquireKey) error {
			_, err := nd.Apply(context.Background(), ledger.Acquire{Now: ledger.InstantOf(time.Now()), Caller: c, Keys: keys})
			return err
		}))
		logs.report(b, w0, n0)
	})
	// replicated: the wired path with cmd/allocator's default linger;
	// replicated-linger0: without it.
	for _, name := range []string{"replicated", "replicated-linger0"} {
		b.Run(name, func(b *testing.B) {
			dir := b.TempDir()
			bs, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer bs.Close()
			logs := &countingLogs{BoltStore: bs}
			_, tr := raft.NewInmemTransport("one")
			opts := []allocator.Option{allocator.WithTTL(10 * time.Second)}
			if name == "replicated-linger0" {
				opts = append(opts, allocator.WithCommitLinger(0))
			}
			l, err := allocator.NewReplicated(allocator.ClusterConfig{ID: "one", Transport: tr,
				Node: []cluster.Option{cluster.WithStores(logs, bs), cluster.WithFileSnapshots(filepath.Join(dir, "snaps"), 2)}}, opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			nd := l.Node()
			if err := nd.Bootstrap(raft.Server{ID: nd.ID(), Address: nd.Addr()}); err != nil {
				b.Fatal(err)
			}
			awaitLeader(b, nd)
			w0, n0 := logs.writes.Load(), logs.nanos.Load()
			runCallers(b, ledgerCalls(func(c ledger.Caller, keys []ledger.AcquireKey) error {
				_, err := l.Acquire(context.Background(), c, keys)
				return err
			}))
			logs.report(b, w0, n0)
		})
	}
}

// awaitLeader polls until nd, a one-member cluster, has elected itself.
func awaitLeader(b *testing.B, nd *cluster.Node) {
	for deadline := time.Now().Add(10 * time.Second); !nd.IsLeader(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("the one member did not become leader")
		}
	}
}

// report adds calls/commit and ms/commit since (w0, n0) to b.
func (c *countingLogs) report(b *testing.B, w0, n0 int64) {
	if n := c.writes.Load() - w0; n > 0 {
		b.ReportMetric(float64(b.N)/float64(n), "calls/commit")
		b.ReportMetric(float64(c.nanos.Load()-n0)/float64(n)/1e6, "ms/commit")
	}
}
