//go:build faults

package faults

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect/v2"
	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	"golang.org/x/sys/unix"

	"github.com/rationhq/ration/allocator/cluster"
	"github.com/rationhq/ration/bucket"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// Settings of the hostile-client cases.
const (
	hostileTTL      = 2 * time.Second
	hostileElection = 300 * time.Millisecond
	// hostileServe is how soon after each attack the cluster must answer
	// a call (the prober's, which follows the leader).
	hostileServe = 2 * time.Second
)

// TestHostileClients runs three allocator processes as a cluster (each in
// a network namespace of its own) and two gateways spending a key over
// its limit through it, and attacks it the ways a holder of a gateway's
// token, of the peer secret, or of nothing could:
//
//   - backups, before the load: a flipped byte, a cut, an instant a year
//     ahead, a log index of 2^64-1, a header declaring a GiB (with a GiB
//     streamed after it): each refused (400, 413) with the reason, and no
//     member restores a snapshot nor takes the backup's state (made before
//     more calls, so a restore that got through would show); the
//     leader's peak memory within 64 MB;
//   - the gateway token at the admin API (401 on every route) and as the
//     raft secret (the handshake refused), the admin token at the lease
//     API (Unauthenticated);
//   - the peer secret without membership: a stranger's id, or a member's
//     id from the test's own address: refused in the handshake;
//   - a process on a member's host, with the peer secret, speaking as that
//     member to another: AppendEntries as leader "evil" at a term a
//     thousand above (a term hijack), entries in the leader's name (log
//     injection), a string declared at 2 GiB, an unknown RPC: each
//     refused and the connection closed, no member's term or leader
//     changed, the target's memory within 64 MB;
//   - membership: three members added at unreachable addresses at once
//     (never promoted, removed again: 503 with the reason), and the
//     removal of a live voter while another is down (409): the cluster
//     keeps its three voters and its leader.
//
// After each attack the cluster serves within hostileServe. Over the run:
// every answer to the clients 200 or 429, the bound (checkBound), and the
// replicas byte-identical with no call applied twice (checkAppliedOnce
// replays every member's raft log).
func TestHostileClients(t *testing.T) {
	ctx := deadline(t, 150*time.Second)
	start := time.Now()
	f := startFleet(ctx, t, fleetSpec{name: "hostile", rpm: 600, ttl: hostileTTL, procs: 2, instances: 1,
		members: 3, election: hostileElection})
	c := f.cluster
	p := newProber(t, c, "faults-hostile-probe")
	served := func(what string) {
		t.Helper()
		if d := p.served(ctx, t, time.Now(), what); d > hostileServe {
			t.Errorf("%s: the cluster answered only after %v, want within %v", what, d, hostileServe)
		}
	}
	served("at start")
	t.Logf("cluster of 3 and 2 gateways up in %v", time.Since(start).Round(time.Millisecond))

	hostileBackups(ctx, t, c, p)
	served("after the hostile backups")
	l := f.overLimit(ctx, t, 100)

	wrongCredentials(ctx, t, c)
	served("after the wrong credentials")
	strangers(ctx, t, c)
	served("after the strangers")
	rogueFrames(ctx, t, c)
	served("after the rogue frames")
	hostileMembership(ctx, t, c)
	served("after the membership changes")

	f.finish(ctx, t, l)
	checkAppliedOnce(ctx, t, f, p)
	t.Logf("whole case: %v", time.Since(start).Round(time.Millisecond))
}

// hostileBackups sends the leader backups it must refuse, each leaving the
// state as it was.
func hostileBackups(ctx context.Context, t *testing.T, c *allocCluster, p *prober) {
	t.Helper()
	lead := c.leader(ctx, t, c.all())
	url := c.members[lead].url()
	old := fetchBackup(ctx, t, url)
	for range 5 { // state the old backup does not hold
		if _, err := p.call(ctx); err != nil {
			t.Fatal(err)
		}
	}
	contents, err := cluster.ReadBackup(old)
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(old)
	flipped[len(flipped)-5] ^= 0x20
	ahead := contents
	ahead.Now += bucket.Instant(365 * 24 * time.Hour / time.Microsecond)
	far := contents
	far.Index = math.MaxUint64
	// A backup's header is its magic (8 bytes), its length (8, big-endian)
	// and its checksum (32): this one declares a GiB.
	gib := contents.Encode()[:48]
	binary.BigEndian.PutUint64(gib[8:16], 1<<30)
	restores := func() float64 {
		n := 0.0
		for _, m := range c.members {
			n += mustScrape(ctx, t, m.url()+"/metrics").sum("ration_allocator_raft_snapshot_restores_total")
		}
		return n
	}
	restored := restores()
	pid := c.members[lead].pid()
	hwm := statusKB(t, pid, "VmHWM")
	for _, tc := range []struct {
		name   string
		body   io.Reader
		status int
		reason string
	}{
		{"a flipped byte", bytes.NewReader(flipped), http.StatusBadRequest, "checksum mismatch"},
		{"cut short", bytes.NewReader(old[:len(old)-10]), http.StatusBadRequest, "cut short"},
		{"an instant a year ahead", bytes.NewReader(ahead.Encode()), http.StatusBadRequest, "ahead of this leader's clock"},
		{"index 2^64-1", bytes.NewReader(far.Encode()), http.StatusBadRequest, "log index 18446744073709551615"},
		{"a GiB", io.MultiReader(bytes.NewReader(gib), io.LimitReader(zeros{}, 1<<30)), http.StatusRequestEntityTooLarge, "declares 1073741824 bytes"},
	} {
		code, msg := adminWith(ctx, t, http.MethodPost, url+"/admin/restore", adminToken, tc.body)
		if code != tc.status || !strings.Contains(string(msg), tc.reason) {
			t.Errorf("restore of a backup with %s: %d %q, want %d saying %q", tc.name, code, msg, tc.status, tc.reason)
		}
		if got, err := cluster.ReadBackup(fetchBackup(ctx, t, url)); err != nil || bytes.Equal(got.State, contents.State) || restores() != restored {
			t.Errorf("a restore of a backup with %s went through (%v)", tc.name, err)
		}
	}
	if grown := statusKB(t, pid, "VmHWM") - hwm; grown > 64<<10 {
		t.Errorf("the leader's peak memory grew %d MB through the hostile restores", grown>>10)
	}
	t.Logf("hostile backups: 5 refused, state unchanged; the leader's peak RSS %d MB", statusKB(t, pid, "VmHWM")>>10)
}

// zeros reads zeros for ever.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// adminWith sends method url to a member's admin API with token and body
// (nil: none) and returns the status and the answer. A server that
// answers before reading the whole body may reset the connection as the
// client sends on: the answer read is what counts.
func adminWith(ctx context.Context, t *testing.T, method, url, token string, body io.Reader) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := control.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, url, err)
	}
	return resp.StatusCode, b
}

// members is the cluster's membership as its members list it.
func (c *allocCluster) membership() map[raft.ServerID]raft.ServerAddress {
	m := map[raft.ServerID]raft.ServerAddress{}
	for i, h := range c.net.hosts {
		m[raft.ServerID(fmt.Sprintf("m%d", i))] = raft.ServerAddress(fmt.Sprintf("%s:%d", h.ip, memberRaftPort))
	}
	return m
}

// refusedIn is member i's count of refused peer handshakes and of refused
// frames.
func (c *allocCluster) refusedIn(ctx context.Context, t *testing.T, i int) (handshakes, frames float64) {
	t.Helper()
	m := mustScrape(ctx, t, c.members[i].url()+"/metrics")
	return m.sum("ration_allocator_raft_peer_refused_total", "direction", "in"), m.sum("ration_allocator_raft_frames_refused_total", "direction", "in")
}

// wrongCredentials presents each credential where it does not belong.
func wrongCredentials(ctx context.Context, t *testing.T, c *allocCluster) {
	t.Helper()
	lead := c.leader(ctx, t, c.all())
	url := c.members[lead].url()
	for _, r := range []struct{ method, path, body string }{
		{http.MethodGet, "/admin/cluster", ""},
		{http.MethodPost, "/admin/cluster/members", `{"id":"evil","raft_address":"198.51.100.7:7451"}`},
		{http.MethodDelete, "/admin/cluster/members/m1", ""},
		{http.MethodGet, "/admin/backup", ""},
		{http.MethodPost, "/admin/restore", "x"},
	} {
		if code, _ := adminWith(ctx, t, r.method, url+r.path, token, strings.NewReader(r.body)); code != http.StatusUnauthorized {
			t.Errorf("%s %s with the gateway token: %d, want 401", r.method, r.path, code)
		}
	}
	src, err := spender.DialAllocator(url, spender.WithTokenFile(writeSecret(t, t.TempDir(), "admin", adminToken)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = src.Acquire(ctx, &leasev1.AcquireRequest{Caller: &leasev1.Caller{SpenderId: "admin", Epoch: 1, Sequence: 1},
		Keys: []*leasev1.KeyAcquire{{Key: "k", Limits: &leasev1.Limits{Rpm: 60}, Want: &leasev1.Amount{Requests: 1}, Held: &leasev1.Amount{}}}})
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("the lease API with the admin token: %v, want Unauthenticated", err)
	}
	before, _ := c.refusedIn(ctx, t, lead)
	for _, secret := range []string{token, adminToken} {
		if err := dialRaft(t, "", "m1", secret, c.membership(), c.membership()[raft.ServerID(fmt.Sprintf("m%d", lead))]); !errors.Is(err, cluster.ErrPeerRefused) {
			t.Errorf("raft with a %s as the secret: %v, want refused", map[string]string{token: "gateway token", adminToken: "admin token"}[secret], err)
		}
	}
	waitRefused(ctx, t, c, lead, before+2, -1)
	t.Logf("wrong credentials: the gateway token refused by the admin API's 5 routes and as the raft secret, the admin token by the lease API and raft")
}

// dialRaft dials addr's raft port as member id with secret, from the
// network namespace ns ("" = the test's own), on a stream layer of its
// own, and returns the handshake's error (closing the connection if it
// got one).
func dialRaft(t *testing.T, ns string, id raft.ServerID, secret string, members map[raft.ServerID]raft.ServerAddress, addr raft.ServerAddress) error {
	t.Helper()
	var err error
	inNetns(t, ns, func() {
		var sl *cluster.StreamLayer
		if sl, err = rogueLayer(t, ns, id, secret, members); err != nil {
			return
		}
		defer sl.Close()
		var conn net.Conn
		if conn, err = sl.Dial(addr, 2*time.Second); err == nil {
			conn.Close()
		}
	})
	return err
}

// rogueLayer is a stream layer for the test's own connections, listening
// on the address of ns's member (any, in the test's own namespace).
func rogueLayer(t *testing.T, ns string, id raft.ServerID, secret string, members map[raft.ServerID]raft.ServerAddress) (*cluster.StreamLayer, error) {
	t.Helper()
	// In the test's namespace it listens on every address, so that it
	// dials from the one routed to the members (the bridge's).
	listen, advertise := "0.0.0.0:0", net.Addr(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if ns != "" {
		host, _, _ := net.SplitHostPort(string(members[id]))
		listen, advertise = host+":0", nil
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	return cluster.NewStreamLayer(cluster.StreamConfig{Listener: ln, Advertise: advertise, ID: id,
		Members: func() map[raft.ServerID]raft.ServerAddress { return members }, Tokens: []string{secret}, HandshakeTimeout: 2 * time.Second})
}

// inNetns runs f on a thread in the network namespace ns ("" = this
// one's): the sockets f opens belong to ns. The thread goes back to this
// namespace and to the runtime afterwards rather than ending: the child
// processes started from it (startProc) get SIGKILL when their parent
// thread ends (Pdeathsig), and any thread may have started one. Only if
// the way back fails does the thread end with the goroutine.
func inNetns(t *testing.T, ns string, f func()) {
	t.Helper()
	if ns == "" {
		f()
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			t.Errorf("opening this thread's namespace: %v", err)
			return
		}
		defer home.Close()
		target, err := os.Open(filepath.Join("/var/run/netns", ns))
		if err != nil {
			t.Errorf("opening namespace %s: %v", ns, err)
			runtime.UnlockOSThread()
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			t.Errorf("entering namespace %s: %v", ns, err)
			runtime.UnlockOSThread()
			return
		}
		f()
		if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
			t.Errorf("leaving namespace %s: %v (the thread ends, and with it any process it started)", ns, err)
			return
		}
		runtime.UnlockOSThread()
	}()
	<-done
}

// waitRefused waits until member i has counted at least handshakes
// refused handshakes and frames refused frames (-1: either).
func waitRefused(ctx context.Context, t *testing.T, c *allocCluster, i int, handshakes, frames float64) {
	t.Helper()
	var h, f float64
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := poll(ctx, 20*time.Millisecond, func() (bool, error) {
		h, f = c.refusedIn(ctx, t, i)
		return h >= handshakes && (frames < 0 || f >= frames), nil
	})
	if err != nil {
		t.Fatalf("member m%d counted %.0f refused handshakes and %.0f refused frames, want %.0f and %.0f: %v", i, h, f, handshakes, frames, err)
	}
}

// strangers hold the peer secret but are not members: refused in the
// handshake.
func strangers(ctx context.Context, t *testing.T, c *allocCluster) {
	t.Helper()
	lead := c.leader(ctx, t, c.all())
	members := c.membership()
	members["evil"] = "198.51.100.7:7451"
	target := members[raft.ServerID(fmt.Sprintf("m%d", lead))]
	before, _ := c.refusedIn(ctx, t, lead)
	other := fmt.Sprintf("m%d", (lead+1)%3)
	for _, id := range []raft.ServerID{"evil", raft.ServerID(other)} {
		if err := dialRaft(t, "", id, peerToken, members, target); !errors.Is(err, cluster.ErrPeerRefused) {
			t.Errorf("a stranger naming itself %s, with the peer secret: %v, want refused", id, err)
		}
	}
	waitRefused(ctx, t, c, lead, before+2, -1)
	t.Logf("strangers with the peer secret: a stranger's id and %s's id from the test's address refused", other)
}

// rogueFrames speaks as a follower, from its host, to another member,
// sending what no member may.
func rogueFrames(ctx context.Context, t *testing.T, c *allocCluster) {
	t.Helper()
	lead := c.leader(ctx, t, c.all())
	as, target := (lead+1)%3, (lead+2)%3
	members := c.membership()
	asID, leadID := raft.ServerID(fmt.Sprintf("m%d", as)), raft.ServerID(fmt.Sprintf("m%d", lead))
	before := map[int]raftRole{}
	for i := range c.members {
		r, err := c.role(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		before[i] = r
	}
	_, framesBefore := c.refusedIn(ctx, t, target)
	rss := statusKB(t, c.members[target].pid(), "VmHWM")
	enc := func(rpc byte, req any) []byte {
		var b []byte
		if err := codec.NewEncoderBytes(&b, &codec.MsgpackHandle{}).Encode(req); err != nil {
			t.Fatal(err)
		}
		return append([]byte{rpc}, b...)
	}
	hijack := enc(0, &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("evil"), Addr: []byte("198.51.100.7:7451")},
		Term: uint64(before[target].term) + 1000, Leader: []byte("198.51.100.7:7451")})
	inject := enc(0, &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte(leadID), Addr: []byte(members[leadID])},
		Term: uint64(before[target].term), Leader: []byte(members[leadID]), LeaderCommitIndex: 1 << 40,
		Entries: []*raft.Log{{Index: 1 << 40, Term: uint64(before[target].term), Type: raft.LogCommand, Data: []byte("injected")}}})
	huge := []byte{0, 0x81, 0xa4, 'D', 'a', 't', 'a', 0xc6, 0x7f, 0xff, 0xff, 0xff} // a 2 GiB bin declared
	for _, x := range []struct {
		name string
		data []byte
	}{{"a term hijack", hijack}, {"log injection", inject}, {"a 2 GiB string", append(huge, make([]byte, 1<<20)...)}, {"an unknown RPC", []byte{9, 0x80}}} {
		var err error
		inNetns(t, c.net.hosts[as].ns, func() {
			sl, e := rogueLayer(t, c.net.hosts[as].ns, asID, peerToken, members)
			if e != nil {
				err = e
				return
			}
			defer sl.Close()
			conn, e := sl.Dial(members[raft.ServerID(fmt.Sprintf("m%d", target))], 2*time.Second)
			if e != nil {
				err = fmt.Errorf("the handshake as %s: %w", asID, e)
				return
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			conn.Write(x.data)
			_, err = conn.Read(make([]byte, 1))
		})
		var ne net.Error
		if err == nil || errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("%s from %s to m%d: the connection stayed open (%v)", x.name, asID, target, err)
		}
	}
	waitRefused(ctx, t, c, target, -1, framesBefore+4)
	if grown := statusKB(t, c.members[target].pid(), "VmHWM") - rss; grown > 64<<10 {
		t.Errorf("m%d's peak memory grew %d MB through the rogue frames", target, grown>>10)
	}
	now := c.leader(ctx, t, c.all())
	for i := range c.members {
		r, err := c.role(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		if r.term != before[i].term {
			t.Errorf("m%d's term went from %.0f to %.0f", i, before[i].term, r.term)
		}
	}
	if now != lead {
		t.Errorf("the leader changed from m%d to m%d", lead, now)
	}
	t.Logf("rogue frames from %s's host to m%d: term hijack, log injection, a 2 GiB string, an unknown RPC refused; terms and leader unchanged", asID, target)
}

// hostileMembership asks for changes that would cost the cluster its
// quorum.
func hostileMembership(ctx context.Context, t *testing.T, c *allocCluster) {
	t.Helper()
	lead := c.leader(ctx, t, c.all())
	url := c.members[lead].url()
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			body := fmt.Sprintf(`{"id":"ghost%d","raft_address":"198.51.100.%d:7451"}`, i, 10+i)
			code, msg := adminWith(ctx, t, http.MethodPost, url+"/admin/cluster/members", adminToken, strings.NewReader(body))
			if code != http.StatusServiceUnavailable || !strings.Contains(string(msg), "never answered") {
				t.Errorf("adding an unreachable member: %d %q, want 503 saying it never answered", code, msg)
			}
		})
	}
	wg.Wait()
	code, msg := adminWith(ctx, t, http.MethodGet, url+"/admin/cluster", adminToken, nil)
	if code != http.StatusOK || bytes.Count(msg, []byte(`"voter":true`)) != 3 || bytes.Contains(msg, []byte("ghost")) {
		t.Errorf("members after the unreachable adds: %d %s", code, msg)
	}
	down, live := (lead+1)%3, (lead+2)%3
	c.kill(ctx, t, down)
	code, msg = adminWith(ctx, t, http.MethodDelete, url+fmt.Sprintf("/admin/cluster/members/m%d", live), adminToken, nil)
	if code != http.StatusConflict || !bytes.Contains(msg, []byte("reachable")) {
		t.Errorf("removing a live voter with another down: %d %q, want 409 saying why", code, msg)
	}
	c.members[down].restart(ctx, t)
	c.leader(ctx, t, c.all())
	t.Logf("membership: 3 unreachable members never promoted and removed again; removing m%d with m%d down refused: %s", live, down, msg)
}
