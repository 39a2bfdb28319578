package allocator_test

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/hashicorp/raft"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/allocator/cluster"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/internal/fakeclock"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/proto/ration/lease/v1/leasev1connect"
)

// A spender talks to an in-process allocator through the same interface as
// to a remote one: *allocator.Service satisfies LeaseServiceClient.
func ExampleService_inProcess() {
	clk := fakeclock.New()
	clk.Set(time.Unix(1_800_000_000, 0))
	led, err := allocator.New(allocator.WithClock(clk), allocator.WithTTL(10*time.Second))
	if err != nil {
		panic(err)
	}
	defer led.Close()
	var client leasev1connect.LeaseServiceClient = allocator.NewService(led)

	resp, err := client.Acquire(context.Background(), &leasev1.AcquireRequest{
		Caller: &leasev1.Caller{SpenderId: "gw-1", Epoch: 1, Sequence: 1},
		Keys: []*leasev1.KeyAcquire{{
			Key:    "key-a",
			Limits: &leasev1.Limits{Rpm: 60, Tpm: 6000},
			Want:   &leasev1.Amount{Requests: 5, Tokens: 1500},
		}},
	})
	if err != nil {
		panic(err)
	}
	g := resp.GetKeys()[0]
	fmt.Println(g.GetStatus(), g.GetGranted().GetRequests(), g.GetGranted().GetTokens())
	fmt.Println("tokens left:", g.GetSnapshot().GetTokens().GetRemaining(), "ttl µs:", resp.GetLeaseTtlUs())
	// Output:
	// GRANT_STATUS_OK 5 1500
	// tokens left: 4500 ttl µs: 10000000
}

// A retried call gets the stored answer; an older one is refused.
func ExampleLedger_Acquire_retry() {
	clk := fakeclock.New()
	clk.Set(time.Unix(1_800_000_000, 0))
	led, _ := allocator.New(allocator.WithClock(clk))
	defer led.Close()
	keys := []ledger.AcquireKey{{Key: "key-a", Limits: ration.Limits{TPM: 600}, Want: ration.Amount{Tokens: 100}}}
	c := ledger.Caller{SpenderID: "gw-1", Epoch: 1, Sequence: 7}
	first, _ := led.Acquire(context.Background(), c, keys)
	again, _ := led.Acquire(context.Background(), c, keys) // the reply was lost
	fmt.Println(first.Keys[0].Granted.Tokens, reflect.DeepEqual(again, first), again.Keys[0].Snapshot.Tokens.Remaining)
	c.Sequence = 6
	_, err := led.Acquire(context.Background(), c, keys)
	fmt.Println(err)
	// Output:
	// 100 true 500
	// allocator: spender "gw-1" epoch 1 sequence 6: stale sequence
}

// A cluster member: here a cluster of one, in memory. The member is
// bootstrapped, elects itself, and applies calls through the raft log; in
// a cluster of three, a follower would answer a *cluster.NotLeaderError
// naming the leader's API URL from cluster.WithAPIURLs.
func ExampleNewReplicated() {
	clk := fakeclock.New()
	clk.Set(time.Unix(1_800_000_000, 0))
	addr, trans := raft.NewInmemTransport("")
	led, err := allocator.NewReplicated(allocator.ClusterConfig{
		ID: "a", Transport: trans,
		Node: []cluster.Option{cluster.WithRaftConfig(func(c *raft.Config) {
			c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = 50*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond
		}), cluster.WithAPIURLs(map[raft.ServerID]string{"a": "http://127.0.0.1:7450"})},
	}, allocator.WithClock(clk))
	if err != nil {
		panic(err)
	}
	defer led.Close()
	if err := led.Node().Bootstrap(raft.Server{ID: "a", Address: addr}); err != nil {
		panic(err)
	}
	for deadline := time.Now().Add(10 * time.Second); led.Node().Ready() != nil && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond) // the election
	}
	r, err := led.Acquire(context.Background(), ledger.Caller{SpenderID: "gw-1", Epoch: 1, Sequence: 1},
		[]ledger.AcquireKey{{Key: "key-a", Limits: ration.Limits{TPM: 600}, Want: ration.Amount{Tokens: 100}}})
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Keys[0].Granted.Tokens, led.Stats().Keys)
	// Output:
	// 100 1
}
