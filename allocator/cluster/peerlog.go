package cluster

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// peerLogEvery is the longest a peer that stays unreachable goes without
// a line in the log.
const peerLogEvery = 30 * time.Second

// peerLog turns raft's lines about calls to an unreachable peer (an
// ERROR for each attempt: a leader retries its heartbeats twice a second
// or more) into one WARN when the peer becomes unreachable, then at most
// one WARN every peerLogEvery with the count of failed calls since the
// last line, and one INFO when the peer answers a heartbeat again. The
// lines it holds back go to DEBUG as raft wrote them. It is safe for
// concurrent use: raft logs from each peer's replication goroutines.
type peerLog struct {
	log  *slog.Logger
	now  func() time.Time
	raft atomic.Pointer[raft.Raft] // names the peers of heartbeat lines, which carry only an address; nil until set

	mu    sync.Mutex
	peers map[string]*peerDown // by server id (an address until raft is set)
}

// peerDown is a peer since its first failed call.
type peerDown struct {
	since    time.Time // its first failed call
	last     time.Time // its latest failed call
	logged   time.Time // the last line about it
	failures int       // failed calls since that line
	total    int       // failed calls since since
}

func newPeerLog(l *slog.Logger, now func() time.Time) *peerLog {
	return &peerLog{log: l, now: now, peers: map[string]*peerDown{}}
}

// setRaft lets p name a peer given by its address after the id the
// configuration gives it.
func (p *peerLog) setRaft(r *raft.Raft) { p.raft.Store(r) }

// peerFailure returns the peer a line of raft's reports a failed call to
// (its argument "peer", "target" or "server-id"), whether the line is one
// of those, and whether it says that the peer is unreachable. The
// leader's lease check ("failed to contact") says only that the peer has
// not answered for a lease timeout: raft logs it for the first three,
// and may do so just after a heartbeat the peer answered, before raft
// records it; it is held back while the peer is reported unreachable,
// and logged as raft wrote it otherwise.
func peerFailure(msg string, args []any) (peer any, ok, unreachable bool) {
	key, unreachable := "peer", true
	switch msg {
	case "failed to heartbeat to", "failed to appendEntries to", "failed to pipeline appendEntries",
		"failed to start pipeline replication to", "failed to send snapshot to", "failed to install snapshot":
	case "failed to make requestVote RPC":
		key = "target"
	case "failed to contact":
		key, unreachable = "server-id", false
	default:
		return nil, false, false
	}
	for i := 0; i+1 < len(args); i += 2 {
		if args[i] == key {
			return args[i+1], true, unreachable
		}
	}
	return nil, false, false
}

// id names peer (a raft.Server, ServerID or ServerAddress) by its server
// id when the configuration knows it, else by what it is.
func (p *peerLog) id(peer any) string {
	switch v := peer.(type) {
	case raft.Server:
		return string(v.ID)
	case raft.ServerID:
		return string(v)
	case raft.ServerAddress:
		if r := p.raft.Load(); r != nil {
			for _, s := range r.GetConfiguration().Configuration().Servers {
				if s.Address == v {
					return string(s.ID)
				}
			}
		}
		return string(v)
	}
	return readable(peer).String()
}

// failed records a failed call to peer, which raft reported with msg and
// attrs, and logs what an operator needs of it: see peerLog. A line that
// does not say that the peer is unreachable (see peerFailure) is only
// counted, and only while the peer is reported unreachable: failed
// reports whether it took the line.
func (p *peerLog) failed(msg string, peer any, unreachable bool, attrs []slog.Attr) bool {
	id, now := p.id(peer), p.now()
	p.mu.Lock()
	d := p.peers[id]
	quiet := d == nil || now.Sub(d.last) >= peerLogEvery // new, or quiet long enough that this is another outage
	switch {
	case quiet && !unreachable:
		p.mu.Unlock()
		return false
	case quiet:
		d = &peerDown{since: now, last: now, logged: now, total: 1}
		p.peers[id] = d
		p.mu.Unlock()
		p.log.LogAttrs(context.Background(), slog.LevelWarn, "cluster: peer unreachable",
			append([]slog.Attr{slog.String("peer", id), slog.String("raft", msg)}, attrs...)...)
		return true
	case now.Sub(d.logged) >= peerLogEvery:
		failures, downFor := d.failures+1, now.Sub(d.since)
		d.last, d.logged, d.failures = now, now, 0
		d.total++
		p.mu.Unlock()
		p.log.LogAttrs(context.Background(), slog.LevelWarn, "cluster: peer still unreachable",
			append([]slog.Attr{slog.String("peer", id), slog.String("down_for", downFor.Round(time.Second).String()),
				slog.Int("failed_calls", failures), slog.String("raft", msg)}, attrs...)...)
		return true
	}
	d.last = now
	d.failures++
	d.total++
	p.mu.Unlock()
	// Held back: raft's own line, for -log-level debug.
	p.log.LogAttrs(context.Background(), slog.LevelDebug, msg, append([]slog.Attr{slog.String("peer", id)}, attrs...)...)
	return true
}

// back records that peer id answered a heartbeat after failed ones, and
// logs it if it was reported unreachable.
func (p *peerLog) back(id raft.ServerID) {
	now := p.now()
	p.mu.Lock()
	d := p.peers[string(id)]
	delete(p.peers, string(id))
	p.mu.Unlock()
	if d != nil {
		p.log.LogAttrs(context.Background(), slog.LevelInfo, "cluster: peer reachable again", slog.String("peer", string(id)),
			slog.String("down_for", now.Sub(d.since).Round(time.Millisecond).String()), slog.Int("failed_calls", d.total))
	}
}

// reset forgets every peer, when this node's role changes: the calls a
// leader or a candidate made are not made any more, and no heartbeat
// will say that the peer is back.
func (p *peerLog) reset() {
	p.mu.Lock()
	clear(p.peers)
	p.mu.Unlock()
}
