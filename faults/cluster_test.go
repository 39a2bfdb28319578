//go:build faults

package faults

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect/v2"

	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// allocCluster is cmd/allocator run as one raft cluster (docs/cluster.md):
// each member in its own network namespace of net, with its own data
// directory, all bootstrapped together. Members are allocatorProcs, so
// they are killed, stopped and restarted in place like a lone allocator.
type allocCluster struct {
	net       *netLayout
	members   []*allocatorProc
	tokenFile string
	election  time.Duration // -cluster-election-timeout
}

// Each member listens for the lease API and for raft on these ports of
// its own address.
const (
	memberAPIPort  = 7450
	memberRaftPort = 7451
)

// startCluster starts n members with lease TTL ttl and election timeout
// election, and waits until each is ready (a leader, or a follower that
// knows it).
func startCluster(ctx context.Context, t *testing.T, n int, ttl, election time.Duration) *allocCluster {
	t.Helper()
	c := &allocCluster{net: newNetLayout(t, n), election: election}
	dir := t.TempDir()
	c.tokenFile = writeToken(t, dir)
	creds := []string{"-admin-token-file", writeSecret(t, dir, "admin", adminToken), "-peer-token-file", writeSecret(t, dir, "peer", peerToken)}
	var peers []string
	for i, h := range c.net.hosts {
		peers = append(peers, fmt.Sprintf("m%d=%s:%d=http://%s:%d", i, h.ip, memberRaftPort, h.ip, memberAPIPort))
	}
	for i, h := range c.net.hosts {
		m := &allocatorProc{name: fmt.Sprintf("member m%d", i), addr: fmt.Sprintf("%s:%d", h.ip, memberAPIPort),
			dataDir: filepath.Join(dir, fmt.Sprintf("m%d", i)), tokenFile: c.tokenFile, ttl: ttl, net: c.net, host: i,
			// -cluster-bootstrap on every start: a member with raft state
			// resumes it (logged), so a restart runs the same command.
			extra: append([]string{"-cluster-id", fmt.Sprintf("m%d", i), "-cluster-peers", strings.Join(peers, ","),
				"-cluster-bootstrap", "-cluster-election-timeout", election.String()}, creds...)}
		m.launch(t)
		c.members = append(c.members, m)
	}
	for _, m := range c.members {
		waitStatus(ctx, t, m.proc, m.url()+"/readyz", http.StatusOK)
	}
	return c
}

func (c *allocCluster) apiURL() string {
	var urls []string
	for _, m := range c.members {
		urls = append(urls, m.url())
	}
	return strings.Join(urls, ",")
}

func (c *allocCluster) tokenPath() string { return c.tokenFile }

// raftRole is what one member's /metrics says of its raft state.
type raftRole struct {
	role string // leader, follower, candidate, shutdown
	term float64
}

// role scrapes member i's role and term, giving up after a short while:
// a stopped or cut-off member does not answer at all.
func (c *allocCluster) role(ctx context.Context, i int) (raftRole, error) {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	m, err := scrape(ctx, c.members[i].url()+"/metrics")
	if err != nil {
		return raftRole{}, err
	}
	r := raftRole{term: m.sum("ration_allocator_raft_term")}
	for _, s := range m {
		if s.name == "ration_allocator_raft_role" && s.value == 1 {
			r.role = s.labels["role"]
		}
	}
	if r.role == "" {
		return r, fmt.Errorf("member m%d reports no raft role", i)
	}
	return r, nil
}

// leader waits until exactly one of the members in live reports the
// leader role, every other one in live follows at the same term, and all
// of them are ready; it returns the leader. The members outside live
// (killed, stopped, cut off) are not asked.
func (c *allocCluster) leader(ctx context.Context, t *testing.T, live []int) int {
	t.Helper()
	lead, last := -1, ""
	err := poll(ctx, 20*time.Millisecond, func() (bool, error) {
		lead, last = -1, ""
		var terms []float64
		for _, i := range live {
			if c.members[i].exited() {
				return false, fmt.Errorf("%s exited: %s", c.members[i].name, c.members[i].state())
			}
			r, err := c.role(ctx, i)
			if err != nil {
				last = err.Error()
				return false, nil
			}
			last += fmt.Sprintf(" m%d=%s(term %.0f)", i, r.role, r.term)
			terms = append(terms, r.term)
			switch {
			case r.role == "leader" && lead >= 0:
				return false, nil
			case r.role == "leader":
				lead = i
			case r.role != "follower":
				return false, nil
			}
			if code, err := getStatus(ctx, c.members[i].url()+"/readyz"); err != nil || code != http.StatusOK {
				return false, nil
			}
		}
		return lead >= 0 && slices.Min(terms) == slices.Max(terms), nil
	})
	if err != nil {
		t.Fatalf("no single leader among members %v with the others following it (last:%s): %v", live, last, err)
	}
	return lead
}

// all lists every member's index.
func (c *allocCluster) all() []int {
	var out []int
	for i := range c.members {
		out = append(out, i)
	}
	return out
}

// without lists every member's index but those of drop.
func (c *allocCluster) without(drop ...int) []int {
	return slices.DeleteFunc(c.all(), func(i int) bool { return slices.Contains(drop, i) })
}

// kill sends member i SIGKILL and waits until it has exited.
func (c *allocCluster) kill(ctx context.Context, t *testing.T, i int) {
	t.Helper()
	m := c.members[i]
	m.signal(t, syscall.SIGKILL)
	if err := m.wait(ctx); err == nil {
		t.Fatalf("%s exited 0 after SIGKILL", m.name)
	}
}

// killLeader is one leader kill: it waits for a settled cluster (one
// leader, the others ready and following), kills the leader with SIGKILL,
// times how long until a call is answered again (the prober's, which
// follows the leader as the gateways do), restarts the killed member on
// its data directory and waits until it is ready again. It returns the
// time to serve again.
func (c *allocCluster) killLeader(ctx context.Context, t *testing.T, p *prober) time.Duration {
	t.Helper()
	lead := c.leader(ctx, t, c.all())
	killed := time.Now()
	c.kill(ctx, t, lead)
	back := p.served(ctx, t, killed, "after SIGKILL of the leader")
	c.members[lead].restart(ctx, t)
	return back
}

// probeKey is the key the prober acquires: its own, so that its calls
// leave the fleet's key alone.
const probeKey = "sk-faults-probe"

// prober is a spender of its own that times when the cluster serves
// again after a fault: it sends one Acquire at a time through
// spender.DialAllocator over every member, which follows the leader as
// the gateways' spenders do, and retries a call that is not answered
// with the same sequence and body (the protocol's exactly-once rule).
type prober struct {
	src      spender.LeaseSource
	id       string
	seq      uint64
	answered int // calls answered
}

func newProber(t *testing.T, c *allocCluster, id string) *prober {
	t.Helper()
	src, err := spender.DialAllocator(c.apiURL(), spender.WithTokenFile(c.tokenFile))
	if err != nil {
		t.Fatal(err)
	}
	return &prober{src: src, id: id}
}

// proberAttempt bounds one attempt: a member that is stopped or cut off
// never answers, and the next attempt goes to the next member.
const proberAttempt = 250 * time.Millisecond

// call sends the next call until a member answers it; it returns when
// that was. An answer other than a grant or a refusal to retry
// (Unavailable: not the leader, no leader; a member down or silent) is
// an error.
func (p *prober) call(ctx context.Context) (time.Time, error) {
	p.seq++
	req := &leasev1.AcquireRequest{
		Caller: &leasev1.Caller{SpenderId: p.id, Epoch: 1, Sequence: p.seq},
		Keys: []*leasev1.KeyAcquire{{Key: probeKey, Limits: &leasev1.Limits{Rpm: 1_000_000},
			Want: &leasev1.Amount{Requests: 1}, Held: &leasev1.Amount{}}},
	}
	for {
		actx, cancel := context.WithTimeout(ctx, proberAttempt)
		_, err := p.src.Acquire(actx, req)
		cancel()
		if err == nil {
			p.answered++
			return time.Now(), nil
		}
		switch code := connect.CodeOf(err); {
		case ctx.Err() != nil:
			return time.Time{}, fmt.Errorf("call %d not answered: %w (last: %v)", p.seq, ctx.Err(), err)
		case code != connect.CodeUnavailable && code != connect.CodeDeadlineExceeded && code != connect.CodeCanceled && !errors.Is(err, context.DeadlineExceeded):
			return time.Time{}, fmt.Errorf("call %d: %w", p.seq, err)
		}
		pause(ctx, 10*time.Millisecond)
	}
}

// served sends calls until one is answered and returns how long after
// since that was; what names the fault, for messages.
func (p *prober) served(ctx context.Context, t *testing.T, since time.Time, what string) time.Duration {
	t.Helper()
	at, err := p.call(ctx)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return at.Sub(since)
}
