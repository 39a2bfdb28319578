package testkit

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"testing"
)

// FixedPorts returns n distinct loopback ports, free when it returns, for
// a process that must listen on the same port again after a restart (a
// cluster member in -cluster-peers, an allocator the gateways keep the URL
// of). It picks them below the kernel's ephemeral range: a port from
// 127.0.0.1:0 lies inside it, so while its owner is down an outgoing
// connection of any process may take it as its source port, and the
// restart fails with "address already in use".
func FixedPorts(t testing.TB, n int) []int {
	t.Helper()
	lo, hi := 10000, ephemeralStart()-1
	if hi-lo < 1000 {
		t.Fatalf("testkit: the ephemeral port range starts at %d: no room below it for fixed ports", hi+1)
	}
	seen := map[int]bool{}
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 100*n {
			t.Fatalf("testkit: found %d of %d free ports in [%d, %d]", len(ports), n, lo, hi)
		}
		p := lo + rand.IntN(hi-lo+1)
		if seen[p] {
			continue
		}
		seen[p] = true
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue // taken
		}
		ln.Close()
		ports = append(ports, p)
	}
	return ports
}

// FixedAddr is one of FixedPorts as "127.0.0.1:port".
func FixedAddr(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", FixedPorts(t, 1)[0])
}

// ephemeralStart is the first port of Linux's ephemeral range (32768 when
// it cannot be read, the kernel's default).
func ephemeralStart() int {
	var lo, hi int
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil || lo <= 0 {
		return 32768
	}
	return lo
}
