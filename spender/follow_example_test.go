package spender_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/internal/fakeclock"
	"github.com/rationhq/ration/spender"
)

// A spender in front of a three-member allocator cluster: DialAllocator is
// given every member's URL. The first call goes to the first member, which
// is not the leader and names it; the same call goes on to the leader,
// which later calls reach directly.
func ExampleDialAllocator_cluster() {
	clock := fakeclock.New() // ration.SystemClock{} in production
	led, err := allocator.New(allocator.WithClock(clock))
	if err != nil {
		panic(err)
	}
	defer led.Close()

	// Three cmd/allocator processes in production; here, members a and c
	// answer NOT_LEADER naming b, and b serves from the ledger.
	j := new(journal)
	var urls []string
	var members []*fakeMember
	for _, name := range []string{"a", "b", "c"} {
		m := &fakeMember{name: name, j: j, svc: allocator.NewService(led)}
		srv := httptest.NewUnstartedServer(m.handler(true))
		srv.Config.Protocols = new(http.Protocols)
		srv.Config.Protocols.SetUnencryptedHTTP2(true) // h2c, as cmd/allocator serves
		srv.Start()
		defer srv.Close()
		urls, members = append(urls, srv.URL), append(members, m)
	}
	members[0].setRole(role{leader: urls[1]})
	members[1].setRole(role{serves: true})
	members[2].setRole(role{leader: urls[1]})

	src, err := spender.DialAllocator(strings.Join(urls, ","), spender.WithToken(clusterToken))
	if err != nil {
		panic(err)
	}
	l, err := spender.New(clock, spender.WithLeases(src), spender.WithSpenderID("gateway-1"))
	if err != nil {
		panic(err)
	}
	r, err := l.Reserve(context.Background(), "key-1", ration.Limits{RPM: 60}, ration.Amount{Requests: 1})
	if err != nil {
		panic(err)
	}
	r.Settle(ration.Amount{Requests: 1})
	fmt.Println("admitted:", spender.AdmissionPath(r))
	if err := l.Close(context.Background()); err != nil { // returns the lease
		panic(err)
	}
	for _, v := range j.since(0) {
		fmt.Println(v.method, "sequence", callerOf(v.req).GetSequence(), "reached", v.member, "served:", v.served)
	}
	// Output:
	// admitted: slow
	// Acquire sequence 1 reached a served: false
	// Acquire sequence 1 reached b served: true
	// Release sequence 2 reached b served: true
}
