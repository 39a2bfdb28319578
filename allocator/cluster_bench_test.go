package allocator_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/allocator/cluster"
	"github.com/rationhq/ration/spender"
)

// A three-member cluster against a single node: durable Acquire of 64
// keys a call over loopback, through the spender's client
// (spender.DialAllocator, Connect over h2c), against the allocator's
// lease API served as cmd/allocator serves it (serveOn). Run the two
// alternately, one binary (docs/performance.md, "Allocator cluster"):
//
//	go test -c -o /tmp/allocator.test ./allocator
//	/tmp/allocator.test -test.run '^$' -test.bench 'ClusterLoopback/single$' -test.benchtime 5s
//	/tmp/allocator.test -test.run '^$' -test.bench 'ClusterLoopback/three$' -test.benchtime 5s
//
// single is cmd/allocator without cluster flags: the journal (bbolt,
// fsync on, 8 ms linger). three is three cluster members in this process,
// each an allocator.NewReplicated on raft-boltdb with fsync in its own
// directory, raft's default timeouts (cmd/allocator's with its default
// -cluster-election-timeout of 1 s), talking raft over the token-
// authenticated TCP StreamLayer on loopback, each serving its lease API
// on its own loopback listener; the callers are given all three URLs and
// follow the leader. Every caller is a gateway with its own client (its
// own connection), *benchCallers of them.
func BenchmarkClusterLoopback(b *testing.B) {
	b.Run("single", func(b *testing.B) {
		l, report := openJournal(b)
		runCallers(b, sourceCalls(b, serveLoopback(b, allocator.NewService(l))))
		report()
	})
	b.Run("three", func(b *testing.B) {
		c := startLoopbackCluster(b, 3)
		runCallers(b, sourceCalls(b, strings.Join(c.urls, ",")))
		c.report()
	})
}

// sourceCalls adapts runCallers to Acquire calls over the network: each
// caller dials members (spender.DialAllocator's comma-separated list) with
// a client of its own, and every call acquires the same 64 keys as
// ledgerCalls'.
func sourceCalls(b *testing.B, members string) func(string) func(uint64) error {
	return func(id string) func(uint64) error {
		src, err := spender.DialAllocator(members)
		if err != nil {
			b.Fatal(err)
		}
		req := benchRequest(64, "durable")
		req.Caller.SpenderId = id
		return func(seq uint64) error {
			req.Caller.Sequence = seq
			_, err := src.Acquire(context.Background(), req)
			return err
		}
	}
}

// loopbackCluster is n cluster members in this process (see
// BenchmarkClusterLoopback), with their lease API URLs.
type loopbackCluster struct {
	b     *testing.B
	urls  []string
	led   []*allocator.Member
	logs  []*countingLogs
	w0    []int64 // each member's log writes when the cluster was ready
	nanos []int64
	term  uint64 // the leader's term when the cluster was ready
}

// startLoopbackCluster starts n members, bootstraps them and returns once
// one leads and every member is ready. Everything stops when b ends.
func startLoopbackCluster(b *testing.B, n int) *loopbackCluster {
	b.Helper()
	c := &loopbackCluster{b: b}
	apiURLs := map[raft.ServerID]string{}
	var api, rafts []net.Listener
	var layers []*cluster.StreamLayer
	var servers []raft.Server
	members := map[raft.ServerID]raft.ServerAddress{}
	for i := range n {
		id := raft.ServerID(fmt.Sprintf("m%d", i))
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		rln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		apiURLs[id] = "http://" + ln.Addr().String()
		c.urls = append(c.urls, apiURLs[id])
		api, rafts = append(api, ln), append(rafts, rln)
		members[id] = raft.ServerAddress(rln.Addr().String())
		servers = append(servers, raft.Server{ID: id, Address: members[id]})
	}
	for i, s := range servers {
		sl, err := cluster.NewStreamLayer(cluster.StreamConfig{Listener: rafts[i], ID: s.ID,
			Members: func() map[raft.ServerID]raft.ServerAddress { return members }, Tokens: []string{"bench-cluster-token"}})
		if err != nil {
			b.Fatal(err)
		}
		layers = append(layers, sl)
	}
	for i, s := range servers {
		dir := b.TempDir()
		bs, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db")) // fsync on
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { bs.Close() }) // after the Ledger's Close (cleanups run last first)
		logs := &countingLogs{BoltStore: bs}
		l, err := allocator.NewReplicated(allocator.ClusterConfig{ID: s.ID, Transport: cluster.NewNetworkTransport(layers[i], nil),
			Node: []cluster.Option{cluster.WithStores(logs, bs), cluster.WithFileSnapshots(filepath.Join(dir, "snapshots"), 2), cluster.WithAPIURLs(apiURLs)}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { l.Close() })
		serveOn(b, api[i], allocator.NewService(l.Ledger))
		c.led, c.logs = append(c.led, l), append(c.logs, logs)
	}
	if err := c.led[0].Node().Bootstrap(servers...); err != nil {
		b.Fatal(err)
	}
	c.awaitReady()
	for _, lg := range c.logs {
		c.w0, c.nanos = append(c.w0, lg.writes.Load()), append(c.nanos, lg.nanos.Load())
	}
	c.term = c.led[c.leader()].Node().Raft().CurrentTerm()
	return c
}

// awaitReady polls until a member leads and every member is ready.
func (c *loopbackCluster) awaitReady() {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if c.leader() >= 0 && c.allReady() {
			return
		}
		if time.Now().After(deadline) {
			c.b.Fatal("the cluster did not elect a leader known to every member within 30 s")
		}
	}
}

func (c *loopbackCluster) allReady() bool {
	for _, l := range c.led {
		if l.Node().Ready() != nil {
			return false
		}
	}
	return true
}

// leader returns the index of the member that leads, or -1.
func (c *loopbackCluster) leader() int {
	for i, l := range c.led {
		if l.Node().IsLeader() {
			return i
		}
	}
	return -1
}

// report adds the leader's calls/commit and ms/commit (its log writes,
// one fsync each) since the cluster was ready, and the elections held
// during the run (a leader that misses its heartbeats under load is
// replaced, which the calls/s then include).
func (c *loopbackCluster) report() {
	i := c.leader()
	if i < 0 {
		c.b.Fatal("no leader at the end of the run")
	}
	c.logs[i].report(c.b, c.w0[i], c.nanos[i])
	c.b.ReportMetric(float64(c.led[i].Node().Raft().CurrentTerm()-c.term), "elections")
}
