package cluster

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/rationhq/ration/allocator/ledger"
)

// BenchmarkFailover's flags: it is a measurement, not a check, and takes a
// few seconds per kill.
var (
	failoverKills   = flag.Int("failover.kills", 20, "BenchmarkFailover: leaders to kill")
	failoverTimeout = flag.Duration("failover.timeout", time.Second, "BenchmarkFailover: heartbeat and election timeout (leader lease: half)")
)

// prodRaft: by default raft's defaults, which Consul ships as its
// production setting (raft_multiplier 1): heartbeat and election timeout
// 1 s, leader lease 500 ms, commit timeout 50 ms; stated here so that a
// change of raft's defaults does not move the measurement.
func prodRaft(c *raft.Config) {
	c.HeartbeatTimeout = *failoverTimeout
	c.ElectionTimeout = *failoverTimeout
	c.LeaderLeaseTimeout = *failoverTimeout / 2
	c.CommitTimeout = 50 * time.Millisecond
}

// BenchmarkFailover measures the time to serve again after the leader is
// killed: from the call of the leader's Shutdown (its transport then cut
// off, as a dead process refuses connections) to the first Apply that
// returns committed on the new leader, on three in-memory nodes with
// prodRaft's timeouts. Each kill uses a new cluster that has elected a
// leader, applied a call and run 300 ms. It logs the distribution and
// reports p50 and p99 in seconds; it asserts nothing about time, and runs
// only with -bench (docs/performance.md, "Allocator cluster"):
//
//	go test -run '^$' -bench Failover -benchtime 1x -v ./allocator/cluster -failover.kills 20
func BenchmarkFailover(b *testing.B) {
	keys := durableKeys()
	var serve, elect, shut []time.Duration
	for range *failoverKills {
		func() {
			c := newCluster(b, 3, prodRaft)
			defer func() { // this kill's cluster ends here, not with the benchmark
				for i, nd := range c.nodes {
					if !c.down[i] {
						c.down[i] = true
						_ = nd.Shutdown()
					}
				}
			}()
			caller := ledger.Caller{SpenderID: "gateway", Epoch: 1, Sequence: 1}
			c.apply(ledger.Acquire{Now: ledger.InstantOf(time.Now()), Caller: caller, Keys: keys})
			time.Sleep(300 * time.Millisecond) // a few heartbeats of steady state
			old := slices.Index(c.nodes, c.leader())
			t0 := time.Now()
			c.shutdown(old)
			shutDone := time.Since(t0)
			var elected time.Duration
			for {
				if time.Since(t0) > time.Minute {
					b.Fatal("no new leader served within a minute")
				}
				for i, nd := range c.nodes {
					if c.down[i] || !nd.IsLeader() {
						continue
					}
					if elected == 0 {
						elected = time.Since(t0)
					}
					caller.Sequence++
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					_, err := nd.Apply(ctx, ledger.Acquire{Now: ledger.InstantOf(time.Now()), Caller: caller, Keys: keys})
					cancel()
					if err == nil {
						serve, elect, shut = append(serve, time.Since(t0)), append(elect, elected), append(shut, shutDone)
						return
					}
				}
				time.Sleep(time.Millisecond) // poll interval
			}
		}()
	}
	if len(serve) == 0 {
		return
	}
	summary := func(name string, d []time.Duration, unit time.Duration) string {
		s := slices.Clone(d)
		slices.Sort(s)
		q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] } // nearest rank
		var all []string
		for _, x := range s {
			all = append(all, x.Round(unit).String())
		}
		return fmt.Sprintf("%s over %d kills: min %v p50 %v p99 %v max %v; all: %s", name, len(s),
			s[0].Round(unit), q(0.50).Round(unit), q(0.99).Round(unit),
			s[len(s)-1].Round(unit), strings.Join(all, " "))
	}
	b.Logf("timeouts: heartbeat %v, election %v, leader lease %v", *failoverTimeout, *failoverTimeout, *failoverTimeout/2)
	b.Log(summary("kill to first committed Apply on the new leader", serve, time.Millisecond))
	b.Log(summary("kill to a leader seen", elect, time.Millisecond))
	b.Log(summary("the old leader's Shutdown call", shut, time.Microsecond))
	s := slices.Sorted(slices.Values(serve))
	b.ReportMetric(s[len(s)/2].Seconds(), "p50-s")
	b.ReportMetric(s[min(len(s)-1, int(0.99*float64(len(s))))].Seconds(), "p99-s")
}
