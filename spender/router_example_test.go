package spender_test

import (
	"context"
	"fmt"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/spender"
)

// A Router spreads keys over two allocator clusters, each with its own
// ledger: a gateway holds one leased Limiter per cluster, and every
// gateway sends a key to the same cluster (rendezvous hashing of the key
// over the cluster names).
func ExampleRouter() {
	clock := fakeclock.New()
	var clusters []spender.Cluster
	for _, name := range []string{"eu-1", "eu-2"} {
		ledger, err := allocator.New(allocator.WithClock(clock)) // in production: spender.DialAllocator(url)
		if err != nil {
			panic(err)
		}
		defer ledger.Close()
		lim, err := spender.New(clock, spender.WithLeases(allocator.NewService(ledger)), spender.WithSpenderID("gw-1"))
		if err != nil {
			panic(err)
		}
		clusters = append(clusters, spender.Cluster{Name: name, Limiter: lim})
	}
	router, err := spender.NewRouter(clusters...)
	if err != nil {
		panic(err)
	}
	defer router.Close(context.Background())

	lim := ration.Limits{RPM: 60, TPM: 10_000}
	for _, key := range []string{"key-1", "key-2", "key-3", "key-4"} {
		_, err := router.Reserve(context.Background(), key, lim, ration.Amount{Requests: 1, Tokens: 100})
		fmt.Printf("%s on %s: admitted %v\n", key, router.Cluster(key), err == nil)
	}
	// Output:
	// key-1 on eu-2: admitted true
	// key-2 on eu-2: admitted true
	// key-3 on eu-1: admitted true
	// key-4 on eu-2: admitted true
}
