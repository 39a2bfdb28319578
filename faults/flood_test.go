//go:build faults

package faults

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// floodConns is how many connections the flood opens to the leader's
// raft port; floodRejoin is how soon a follower restarted meanwhile must
// be ready again.
const (
	floodConns  = 20_000
	floodRejoin = 2 * time.Second
)

// TestRaftConnectionFlood opens floodConns TCP connections to the raft
// port of a three-member cluster's leader, from one address, and sends
// nothing on them (they never authenticate), holding them open. The
// leader keeps a bounded number of file descriptors (it closes what is
// beyond its handshake bounds at once), keeps serving (a call answered
// within hostileServe), and a follower killed and restarted meanwhile is
// ready again within floodRejoin of its start. The connections are held
// by floodProcs copies of this test binary (floodEnv), so that no process
// needs a file limit above the usual 20,000.
func TestRaftConnectionFlood(t *testing.T) {
	ctx := deadline(t, 90*time.Second)
	c := startCluster(ctx, t, 3, hostileTTL, hostileElection)
	p := newProber(t, c, "faults-flood-probe")
	p.served(ctx, t, time.Now(), "at start")
	lead := c.leader(ctx, t, c.all())
	pid := c.members[lead].pid()
	fds := openFDs(t, pid)

	start := time.Now()
	conns, failed := flood(ctx, t, fmt.Sprintf("%s:%d", c.net.hosts[lead].ip, memberRaftPort), floodConns)
	during := openFDs(t, pid)
	t.Logf("flood: %d connections opened to m%d's raft port in %v (%d dials failed); its open files %d before, %d during",
		conns, lead, time.Since(start).Round(time.Millisecond), failed, fds, during)
	if conns < floodConns/2 {
		t.Errorf("only %d of %d connections opened: the flood did not happen", conns, floodConns)
	}
	if during > fds+200 {
		t.Errorf("m%d holds %d open files during the flood, %d before: the flood is not bounded", lead, during, fds)
	}
	if d := p.served(ctx, t, time.Now(), "during the flood"); d > hostileServe {
		t.Errorf("during the flood the cluster answered only after %v, want within %v", d, hostileServe)
	}
	f := (lead + 1) % 3
	c.kill(ctx, t, f)
	restarted := time.Now()
	c.members[f].launch(t)
	waitStatus(ctx, t, c.members[f].proc, c.members[f].url()+"/readyz", http.StatusOK)
	rejoined := time.Since(restarted)
	t.Logf("m%d killed and restarted during the flood: ready %v after its start", f, rejoined.Round(time.Millisecond))
	if rejoined > floodRejoin {
		t.Errorf("m%d was ready again only %v after its restart, want within %v", f, rejoined.Round(time.Millisecond), floodRejoin)
	}
	if d := p.served(ctx, t, time.Now(), "after the rejoin"); d > hostileServe {
		t.Errorf("after the rejoin the cluster answered only after %v", d)
	}
}

// floodEnv, set to "address,n", makes this test binary a flooder: it
// opens n connections to address, says how many on its output, and holds
// them until it is killed (see TestMain). floodProcs flooders share a
// flood.
const (
	floodEnv   = "FAULTS_FLOOD"
	floodProcs = 2
)

// floodSaid is a flooder's report.
var floodSaid = regexp.MustCompile(`flood: opened (\d+), failed (\d+)`)

// flood opens n connections to addr, spread over floodProcs flooders,
// held until the test ends, and returns how many opened and how many
// dials failed.
func flood(ctx context.Context, t *testing.T, addr string, n int) (opened, failed int) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var ps []*proc
	for i := range floodProcs {
		share := n / floodProcs
		if i == 0 {
			share += n % floodProcs
		}
		ps = append(ps, startProc(t, fmt.Sprintf("flooder %d", i+1), exe, []string{fmt.Sprintf("%s=%s,%d", floodEnv, addr, share)}, "-test.run=^$"))
	}
	for _, p := range ps {
		var m []string
		err := poll(ctx, 50*time.Millisecond, func() (bool, error) {
			if p.exited() {
				return false, fmt.Errorf("%s exited: %s\n%s", p.name, p.state(), p.logs.String())
			}
			m = floodSaid.FindStringSubmatch(p.logs.String())
			return m != nil, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		o, _ := strconv.Atoi(m[1])
		f, _ := strconv.Atoi(m[2])
		opened, failed = opened+o, failed+f
	}
	return opened, failed
}

// floodFrom is a flooder's work: arg is "address,n". It never returns.
func floodFrom(arg string) {
	addr, count, _ := strings.Cut(arg, ",")
	n, err := strconv.Atoi(count)
	if err != nil {
		fmt.Println("flood:", err)
		os.Exit(2)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var next, bad atomic.Int64
	var wg sync.WaitGroup
	for range 256 {
		wg.Go(func() {
			d := net.Dialer{Timeout: 3 * time.Second}
			for next.Add(1) <= int64(n) {
				c, err := d.Dial("tcp", addr)
				if err != nil {
					bad.Add(1)
					continue
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	fmt.Printf("flood: opened %d, failed %d\n", len(conns), bad.Load())
	select {} // held until killed
}
