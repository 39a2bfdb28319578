//go:build faults

package faults

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// netLayout is a network of its own for an allocator cluster: a bridge in
// the root network namespace and, per member, a network namespace joined
// to the bridge by a veth pair. Each member listens on its own address;
// the test and the gateways, in the root namespace, reach every member
// through the bridge's address. Taking a member's veth down cuts it off
// from its peers and from the gateways alike: a partition, where packets
// are dropped (no reset, no refusal), as on a real network.
//
// It is built with iproute2's ip command and needs root (CAP_NET_ADMIN).
// Names carry the test binary's pid, so that what a crashed earlier run
// left behind never collides; everything is deleted when the test ends.
type netLayout struct {
	bridge string    // the bridge's name, in the root namespace
	hosts  []netHost // one per member
}

// netHost is one member's namespace.
type netHost struct {
	ns   string // network namespace name (ip netns)
	veth string // the root namespace's end of its veth pair
	ip   string // its address on the bridge's /24
}

// netBase is the /15 the layouts take a /24 from: 198.18.0.0/15, set
// aside for network benchmarks (RFC 2544), so no real network on a test
// machine uses it.
const netBase = 18 // 198.18.0.0 to 198.19.255.255

// newNetLayout builds a bridge and n namespaces, or fails the test with
// the reason (no ip command, not root). A layout that cannot be built is
// a failure, never a skip: the partition case would silently not run.
func newNetLayout(t *testing.T, n int) *netLayout {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatalf("network namespaces for the partition case need iproute2's ip command (apt-get install iproute2): %v", err)
	}
	pid := os.Getpid()
	l := &netLayout{bridge: fmt.Sprintf("rfb%d", pid)}
	subnet, err := freeSubnet(pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.remove(t) })
	// The cleanup runs whatever was built: ip refuses an existing name,
	// and a half-built layout is removed like a whole one.
	for i := range n {
		l.hosts = append(l.hosts, netHost{ns: fmt.Sprintf("ration-faults-%d-%d", pid, i),
			veth: fmt.Sprintf("rfv%dn%d", pid, i), ip: fmt.Sprintf("%s.%d", subnet, 10+i)})
	}
	steps := [][]string{
		{"link", "add", l.bridge, "type", "bridge"},
		{"addr", "add", subnet + ".1/24", "dev", l.bridge},
		{"link", "set", l.bridge, "up"},
	}
	for _, h := range l.hosts {
		steps = append(steps,
			[]string{"netns", "add", h.ns},
			[]string{"link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.ns},
			[]string{"link", "set", h.veth, "master", l.bridge, "up"},
			[]string{"-n", h.ns, "addr", "add", h.ip + "/24", "dev", "eth0"},
			[]string{"-n", h.ns, "link", "set", "eth0", "up"},
			[]string{"-n", h.ns, "link", "set", "lo", "up"})
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			t.Fatalf("building the network namespaces of the partition case (this needs root: CAP_NET_ADMIN): %v", err)
		}
	}
	return l
}

// freeSubnet returns a /24 of netBase (its first three octets) that no
// address of this machine is in, starting from one the pid picks.
func freeSubnet(pid int) (string, error) {
	out, err := exec.Command("ip", "-4", "-o", "addr", "show").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("ip -4 -o addr show: %v: %s", err, out)
	}
	for k := range 512 {
		i := (pid + k) % 512
		s := fmt.Sprintf("198.%d.%d", netBase+i/256, i%256)
		if !strings.Contains(string(out), " "+s+".") {
			return s, nil
		}
	}
	return "", errors.New("no free /24 in 198.18.0.0/15 for the partition case's bridge")
}

// cut takes host i's veth down: it can reach no one, and no one it.
func (l *netLayout) cut(t *testing.T, i int) {
	t.Helper()
	if err := ip("link", "set", l.hosts[i].veth, "down"); err != nil {
		t.Fatal(err)
	}
}

// heal brings host i's veth back up.
func (l *netLayout) heal(t *testing.T, i int) {
	t.Helper()
	if err := ip("link", "set", l.hosts[i].veth, "up"); err != nil {
		t.Fatal(err)
	}
}

// isolate cuts host i off from the other hosts but not from the root
// namespace (the test and the gateways): a blackhole route to each peer in
// its namespace, and to it in each peer's. A leader isolated so loses its
// majority while its clients still reach it.
func (l *netLayout) isolate(t *testing.T, i int) {
	t.Helper()
	l.routes(t, i, "add")
}

// rejoin undoes isolate.
func (l *netLayout) rejoin(t *testing.T, i int) {
	t.Helper()
	l.routes(t, i, "del")
}

// routes adds or deletes (op) the blackhole routes between host i and
// every other host.
func (l *netLayout) routes(t *testing.T, i int, op string) {
	t.Helper()
	for j, h := range l.hosts {
		if j == i {
			continue
		}
		for _, r := range [][2]string{{l.hosts[i].ns, h.ip}, {h.ns, l.hosts[i].ip}} {
			if err := ip("-n", r[0], "route", op, "blackhole", r[1]+"/32"); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// command returns the arguments that run path with args inside host i's
// namespace (ip netns exec sets the namespace and then executes path, so
// the process keeps the pid a signal is sent to).
func (l *netLayout) command(i int, path string, args ...string) (string, []string) {
	return "ip", append([]string{"netns", "exec", l.hosts[i].ns, path}, args...)
}

// remove deletes the namespaces (which deletes the veth pairs) and the
// bridge, reporting what it could not delete. The processes inside must
// have exited (startProc's cleanups, registered later, run first).
func (l *netLayout) remove(t *testing.T) {
	for _, h := range l.hosts {
		if err := ip("netns", "delete", h.ns); err != nil && !strings.Contains(err.Error(), "No such file") {
			t.Errorf("removing the partition case's namespace: %v", err)
		}
	}
	if err := ip("link", "delete", l.bridge); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
		t.Errorf("removing the partition case's bridge: %v", err)
	}
}

// ip runs the ip command with args.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
