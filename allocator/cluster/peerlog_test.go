package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// A peer that stays down is reported once at WARN, then at most once per
// peerLogEvery with the failed calls since the last line, and once at
// INFO when it answers again; raft's lines in between go to DEBUG. Peers
// are told apart by server id, whether raft names them by id, by address
// or as a raft.Server. The leader's lease check is raft's own line until
// the peer is known down, then held back too. A failure after a quiet
// peerLogEvery is another outage; a role change forgets every peer.
func TestPeerLog(t *testing.T) {
	var buf syncBuffer
	now := time.Unix(1_000_000, 0)
	a := newHclog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	a.peers.now = func() time.Time { return now }
	lines := func() []string {
		t.Helper()
		out := strings.Split(strings.TrimSpace(buf.String()), "\n")
		buf.b.Reset()
		for i, l := range out {
			out[i] = l[strings.Index(l, "level="):] // drop the time
		}
		return out
	}
	want := func(want ...string) {
		t.Helper()
		got := lines()
		if len(got) != len(want) {
			t.Fatalf("got %d lines, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
		}
		for i := range want {
			if !strings.HasPrefix(got[i], want[i]) {
				t.Fatalf("line %d:\n got %s\nwant %s...", i, got[i], want[i])
			}
		}
	}
	refused := errors.New("dial tcp 10.0.0.2:7451: connect: connection refused")
	b := raft.Server{ID: "b", Address: "10.0.0.2:7451"}

	a.Warn("failed to contact", "server-id", b.ID, "time", 600*time.Millisecond) // not known down: raft's line
	want(`level=WARN msg="failed to contact" server_id=b time=600ms`)
	a.Error("failed to appendEntries to", "peer", b, "error", refused)
	// Without a raft to look it up in, an address names the peer as it is:
	// heartbeat lines name b by its address, here "b".
	for i := range 40 { // 20 s of heartbeats, twice a second
		now = now.Add(500 * time.Millisecond)
		a.Error("failed to heartbeat to", "peer", raft.ServerAddress("b"), "backoff time", 500*time.Millisecond, "error", refused)
		if i == 0 {
			a.Warn("failed to contact", "server-id", b.ID, "time", 1500*time.Millisecond)
		}
	}
	got := lines()
	if len(got) != 42 || got[0] != `level=WARN msg="cluster: peer unreachable" peer=b raft="failed to appendEntries to" error="dial tcp 10.0.0.2:7451: connect: connection refused"` {
		t.Fatalf("%d lines, the first:\n%s", len(got), got[0])
	}
	for _, l := range got[1:] {
		if !strings.HasPrefix(l, "level=DEBUG msg=") || !strings.Contains(l, " peer=b ") {
			t.Fatalf("held back, not at DEBUG: %s", l)
		}
	}

	now = now.Add(10 * time.Second) // 30 s since the WARN
	a.Error("failed to heartbeat to", "peer", raft.ServerAddress("b"), "error", refused)
	want(`level=WARN msg="cluster: peer still unreachable" peer=b down_for=30s failed_calls=42 raft="failed to heartbeat to" error=`)
	now = now.Add(time.Second)
	a.peers.back("b")
	want(`level=INFO msg="cluster: peer reachable again" peer=b down_for=31s failed_calls=43`)
	a.peers.back("b") // a resumed heartbeat with nothing reported: nothing to say
	if buf.String() != "" {
		t.Fatalf("logged: %s", buf.String())
	}

	a.Error("failed to make requestVote RPC", "target", b, "error", refused, "term", 3)
	a.Error("failed to make requestVote RPC", "target", raft.Server{ID: "c"}, "error", refused, "term", 3)
	want(`level=WARN msg="cluster: peer unreachable" peer=b raft="failed to make requestVote RPC" error=`,
		`level=WARN msg="cluster: peer unreachable" peer=c raft="failed to make requestVote RPC" error=`)
	now = now.Add(peerLogEvery)
	a.Error("failed to appendEntries to", "peer", b, "error", refused)
	want(`level=WARN msg="cluster: peer unreachable" peer=b`) // quiet for peerLogEvery: another outage
	a.peers.reset()
	a.Error("failed to appendEntries to", "peer", b, "error", refused)
	want(`level=WARN msg="cluster: peer unreachable" peer=b`)
	a.Info("entering leader state", "leader", stringer("Node at x [Leader]"))
	want(`level=INFO msg="entering leader state" leader="Node at x [Leader]"`)
}

// Against raft itself: while a follower is down, the leader logs one
// WARN for it (raft's lines name it by id and by address: one peer, not
// two) and no ERROR, and one INFO when it is back; the held-back lines
// are many. The property holds while one node leads throughout: a loaded
// machine can depose a leader (each role starts afresh), so the outage is
// tried again, up to three times, until one passes under one leader.
func TestPeerDownLogsOnce(t *testing.T) {
	c := newCluster(t, 3, func(rc *raft.Config) {
		rc.HeartbeatTimeout, rc.ElectionTimeout, rc.LeaderLeaseTimeout = 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
	})
	c.allReadyExcept(nil)
	for attempt := 1; ; attempt++ {
		ld := c.leader()
		down := 0
		for c.nodes[down] == ld {
			down++
		}
		id := c.nodes[down].ID()
		from := len(c.logs.String())
		c.shutdown(down)
		unreachable := fmt.Sprintf(`level=WARN msg="cluster: peer unreachable" node=%s peer=%s`, ld.ID(), id)
		back := regexp.MustCompile(fmt.Sprintf(`level=INFO msg="cluster: peer reachable again" node=%s peer=%s .*failed_calls=(\d+)`, ld.ID(), id))
		deposed := regexp.MustCompile(`msg="entering (leader|follower|candidate) state" node=` + string(ld.ID()))
		since := func() string { return c.logs.String()[from:] }
		pollUntil(t, "the leader reports the peer unreachable", func() bool { return strings.Contains(since(), unreachable) || deposed.MatchString(since()) })
		time.Sleep(time.Second) // raft keeps retrying meanwhile
		c.restart(down)
		pollUntil(t, "the leader reports the peer back", func() bool { return back.MatchString(since()) || deposed.MatchString(since()) })
		logs := since()
		if deposed.MatchString(logs) {
			if attempt == 3 {
				t.Fatalf("the leader lost its leadership during each of 3 outages")
			}
			t.Logf("attempt %d: %s lost its leadership during the outage; again", attempt, ld.ID())
			c.allReadyExcept(nil)
			continue
		}
		if n := strings.Count(logs, "cluster: peer unreachable"); n != 1 || !strings.Contains(logs, unreachable) || strings.Contains(logs, "level=ERROR") {
			t.Fatalf("%d WARNs for the peer, or an ERROR:\n%s", n, logs)
		}
		if failed, _ := strconv.Atoi(back.FindStringSubmatch(logs)[1]); failed < 5 {
			t.Fatalf("the peer was back after %d failed calls: too few to show that lines were held back\n%s", failed, logs)
		}
		return
	}
}
