package main

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect/v2"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/testkit"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

// freePorts returns n loopback ports that were free a moment ago (the
// members' URLs must be known before they start, to list them in
// -cluster-peers).
func freePorts(t *testing.T, n int) []int { return testkit.FixedPorts(t, n) }

// clusterProcs is a cluster of real allocator processes on loopback.
type clusterProcs struct {
	urls  []string
	procs []*process
}

// startCluster starts n allocator processes as one bootstrapped cluster
// with a 300 ms election timeout, and waits until each is ready (a
// leader, or a follower that knows it).
func startCluster(t *testing.T, n int, extra ...string) *clusterProcs {
	t.Helper()
	dir := t.TempDir()
	tokens := writeTokens(t, dir, "tokens", testToken)
	creds := []string{"-token-file", tokens, "-admin-token-file", writeTokens(t, dir, "admin", testAdminToken),
		"-peer-token-file", writeTokens(t, dir, "peer", testPeerToken)}
	ports := freePorts(t, 2*n)
	c := &clusterProcs{}
	var peers []string
	for i := range n {
		c.urls = append(c.urls, fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]))
		peers = append(peers, fmt.Sprintf("m%d=127.0.0.1:%d=%s", i, ports[2*i+1], c.urls[i]))
	}
	for i := range n {
		args := append([]string{"-listen", strings.TrimPrefix(c.urls[i], "http://"), "-data-dir", filepath.Join(dir, fmt.Sprint(i)),
			"-cluster-id", fmt.Sprintf("m%d", i), "-cluster-peers", strings.Join(peers, ","),
			"-cluster-bootstrap", "-cluster-election-timeout", "300ms"}, append(creds, extra...)...)
		c.procs = append(c.procs, startBinary(t, args...))
	}
	for i := range n {
		waitReady(t, c.urls[i], http.DefaultClient)
	}
	return c
}

// notLeaderURL returns the leader URL of a NOT_LEADER answer, and whether
// err is one.
func notLeaderURL(t *testing.T, err error) (string, bool) {
	info, ok := detailOf[*errdetails.ErrorInfo](t, err)
	if connect.CodeOf(err) != connect.CodeUnavailable || !ok || info.GetReason() != ration.ReasonNotLeader {
		return "", false
	}
	return info.GetMetadata()[ration.MetaLeader], true
}

// probe sends req to every live member and returns the index of the one
// that granted it and the leader URLs the others named; it fails the
// test on any other answer.
func (c *clusterProcs) probe(t *testing.T, req *leasev1.AcquireRequest, live []int) (granted int, named map[int]string, reply *leasev1.AcquireResponse) {
	t.Helper()
	granted, named = -1, map[int]string{}
	for _, i := range live {
		r, err := leaseClient(testkit.H2CClient(), c.urls[i]).Acquire(authed(testToken), req)
		if err == nil {
			granted, reply = i, r
			continue
		}
		url, ok := notLeaderURL(t, err)
		if !ok {
			t.Fatalf("member %d: %v, want a grant or NOT_LEADER", i, err)
		}
		named[i] = url
	}
	return granted, named, reply
}

// TestClusterOfProcesses: three allocator processes form a cluster; a
// follower answers an Acquire with NOT_LEADER naming the leader's URL and
// the leader grants it. After the leader is killed (SIGKILL), the two
// others elect a new leader within the election timeouts, the survivor
// names it, and the same call sent there gets the stored reply: applied
// once.
func TestClusterOfProcesses(t *testing.T) {
	binary(t) // built before the clock starts
	start := time.Now()
	c := startCluster(t, 3)
	// A daily budget: the bucket barely refills during the test, so a
	// second application of the call would show in what remains.
	req := acquireReq("gw-1", 1, "key-a")
	req.Keys[0].Limits.WindowSeconds = 86400
	var (
		lead  int
		named map[int]string
		first *leasev1.AcquireResponse
	)
	// Until the first grant: an election may still be settling.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if lead, named, first = c.probe(t, req, []int{0, 1, 2}); lead >= 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no member granted within 10 s; named %v", named)
		}
	}
	if len(named) != 2 {
		t.Fatalf("member %d granted, others answered %v: want two NOT_LEADER", lead, named)
	}
	for i, url := range named {
		if url != c.urls[lead] {
			t.Fatalf("follower %d names %q as the leader, want %q (member %d granted)", i, url, c.urls[lead], lead)
		}
	}
	if g := first.GetKeys()[0].GetGranted().GetTokens(); g != 100 {
		t.Fatalf("granted %d tokens, want 100", g)
	}
	t.Logf("leader m%d after %v", lead, time.Since(start))

	// kill -9 the leader: no hand-over, the others elect.
	killed := time.Now()
	if err := c.procs[lead].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-c.procs[lead].done
	var live []int
	for i := range 3 {
		if i != lead {
			live = append(live, i)
		}
	}
	var lead2 int
	var again *leasev1.AcquireResponse
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if lead2, named, again = c.probe(t, req, live); lead2 >= 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new leader within 10 s of the kill; named %v", named)
		}
	}
	t.Logf("new leader m%d serving %v after the kill", lead2, time.Since(killed))
	if rem := again.GetKeys()[0].GetSnapshot().GetTokens().GetRemaining(); !proto.Equal(sansSnapshots(again), sansSnapshots(first)) || rem < 5900 || rem > 5905 {
		t.Fatalf("the same call at the new leader:\n got %v\nwant the stored reply %v", again, first)
	}
	for i, url := range named {
		if url != c.urls[lead2] && url != "" {
			t.Fatalf("survivor %d names %q, want %q", i, url, c.urls[lead2])
		}
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("took %v, want under 30 s", took)
	}

	// SIGTERM: both exit cleanly (the leader first tries to hand its
	// leadership over).
	for _, i := range live {
		if err := c.procs[i].cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range live {
		select {
		case err := <-c.procs[i].done:
			if err != nil {
				t.Fatalf("member %d after SIGTERM: %v\n%s", i, err, c.procs[i].logs.String())
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("member %d did not exit after SIGTERM", i)
		}
	}
}

// getBody returns the status and body of GET url.
func getBody(t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, body := testkit.Do(t, req)
	return resp.StatusCode, body
}

// TestMemberReadinessAndMetrics: a member's /readyz follows Node.Ready
// (503 while it knows no leader: here its two peers never start), and
// /metrics carries the node's raft metrics and the peer-refusal counter;
// a one-member cluster elects itself, is ready and serves.
func TestMemberReadinessAndMetrics(t *testing.T) {
	ports := freePorts(t, 8)
	peers := fmt.Sprintf("a=127.0.0.1:%d=http://127.0.0.1:%d,b=127.0.0.1:%d=http://127.0.0.1:%d,c=127.0.0.1:%d=http://127.0.0.1:%d",
		ports[0], ports[1], ports[2], ports[3], ports[4], ports[5])
	cfg := testConfig(t, "-cluster-id", "a", "-cluster-peers", peers, "-cluster-bootstrap", "-cluster-election-timeout", "100ms")
	alone := startServerUnready(t, cfg)
	// It never learns a leader: its peers are not running.
	for range 3 {
		code, body := getBody(t, "http://"+alone.addr+"/readyz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "no leader known") {
			t.Fatalf("/readyz without peers: %d %q", code, body)
		}
		time.Sleep(100 * time.Millisecond) // an election timeout: it stays unready
	}
	_, err := leaseClient(testkit.H2CClient(), "http://"+alone.addr).Acquire(authed(testToken), acquireReq("s", 1, "k"))
	if url, ok := notLeaderURL(t, err); !ok || url != "" {
		t.Fatalf("a member that knows no leader: %v (leader %q), want NOT_LEADER without a URL", err, url)
	}

	one := fmt.Sprintf("solo=127.0.0.1:%d=http://127.0.0.1:%d", ports[6], ports[7])
	ts := startServer(t, testConfig(t, "-cluster-id", "solo", "-cluster-peers", one, "-cluster-bootstrap", "-cluster-election-timeout", "100ms"))
	if _, err := leaseClient(testkit.H2CClient(), "http://"+ts.addr).Acquire(authed(testToken), acquireReq("s", 1, "k")); err != nil {
		t.Fatal(err)
	}
	_, body := getBody(t, "http://"+ts.addr+"/metrics")
	for _, want := range []string{
		`ration_allocator_raft_role{role="leader"} 1`,
		`ration_allocator_raft_peer_refused_total{direction="in"} 0`,
		`ration_allocator_raft_leader_changes_total 1`,
		`ration_allocator_active_keys 1`,
		`ration_allocator_calls_total{code="ok",method="Acquire"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestMembersAuthenticatePeers: two members with the same token, over
// mutual TLS (-tls-cert, -cluster-ca), form a cluster and serve; two
// whose token files differ refuse each other's raft connections, count
// and log them, and never elect.
func TestMembersAuthenticatePeers(t *testing.T) {
	two := func() string {
		p := freePorts(t, 4)
		return fmt.Sprintf("a=127.0.0.1:%d=https://127.0.0.1:%d,b=127.0.0.1:%d=https://127.0.0.1:%d", p[0], p[1], p[2], p[3])
	}
	t.Run("mutual TLS", func(t *testing.T) {
		f := testkit.NewTLSFiles(t)
		peers := two()
		var members []*testServer
		for _, id := range []string{"a", "b"} {
			cfg := testConfig(t, "-tls-cert", f.Cert, "-tls-key", f.Key, "-cluster-ca", f.CA,
				"-cluster-id", id, "-cluster-peers", peers, "-cluster-bootstrap", "-cluster-election-timeout", "100ms")
			members = append(members, startServerUnready(t, cfg))
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: f.Pool}}}
		for _, m := range members {
			waitReady(t, "https://"+m.addr, hc)
			if strings.Contains(m.log.String(), "refused a peer connection") {
				t.Fatalf("a peer was refused:\n%s", m.log.String())
			}
		}
	})
	t.Run("different tokens", func(t *testing.T) {
		peers := two()
		var members []*testServer
		for _, id := range []string{"a", "b"} {
			cfg := testConfig(t, "-cluster-id", id, "-cluster-peers", peers, "-cluster-bootstrap", "-cluster-election-timeout", "100ms")
			if id == "b" {
				cfg.peerTokenFile = writeTokens(t, t.TempDir(), "peer", "another-cluster")
			}
			members = append(members, startServerUnready(t, cfg))
		}
		for _, m := range members {
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				_, body := getBody(t, "http://"+m.addr+"/metrics")
				if strings.Contains(m.log.String(), "cluster: refused a peer connection") &&
					!strings.Contains(body, `ration_allocator_raft_peer_refused_total{direction="in"} 0`) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no refusal counted and logged in 10 s:\n%s", m.log.String())
				}
			}
			if code, body := getBody(t, "http://"+m.addr+"/readyz"); code != http.StatusServiceUnavailable {
				t.Fatalf("/readyz %d %q with its only peer refused", code, body)
			}
		}
	})
}
