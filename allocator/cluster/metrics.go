package cluster

import (
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// RegisterMetrics exports the node's raft metrics on reg (no global
// registry). All but the counter are read from raft and the FSM at scrape
// time; one node per registry (wrap reg with a label to put several on
// one).
//
//	ration_allocator_raft_role{role}                 1 for the node's role (leader, follower, candidate, shutdown), 0 for the others
//	ration_allocator_raft_term                       the current term
//	ration_allocator_raft_last_log_index             the last index in the log (or the last snapshot)
//	ration_allocator_raft_commit_index               the commit index this node knows
//	ration_allocator_raft_applied_index              the last index the ledger applied (or restored)
//	ration_allocator_raft_apply_lag_entries          commit index - applied index on this node
//	ration_allocator_raft_leader_changes_total       times this node learned of a leader (a new one, or one after a time without)
//	ration_allocator_raft_snapshot_restores_total    snapshots the ledger restored
//	ration_allocator_raft_last_contact_seconds       on a follower, since it last heard from the leader; 0 on the leader
//
// The lag is this node's, not per follower as the leader sees it: raft
// v1.7 does not export its followers' match indexes. A follower's
// replication lag is therefore read on the follower: its last contact
// with the leader, and the leader's commit index less its applied index
// across the members' scrapes. The applied index is
// the FSM's: raft's own applied_index also counts entries only queued for
// the FSM. Entries that raft does not hand to the FSM (the no-op a new
// leader appends, configuration changes) count as lag until the next
// command is applied.
func (n *Node) RegisterMetrics(reg prometheus.Registerer) error {
	return reg.Register(&nodeCollector{n: n,
		role:     prometheus.NewDesc("ration_allocator_raft_role", "1 for this node's raft role, 0 for the others.", []string{"role"}, nil),
		term:     prometheus.NewDesc("ration_allocator_raft_term", "The current raft term.", nil, nil),
		last:     prometheus.NewDesc("ration_allocator_raft_last_log_index", "The last index in the raft log or the last snapshot.", nil, nil),
		commit:   prometheus.NewDesc("ration_allocator_raft_commit_index", "The commit index this node knows.", nil, nil),
		applied:  prometheus.NewDesc("ration_allocator_raft_applied_index", "The last log index the ledger applied or restored.", nil, nil),
		lag:      prometheus.NewDesc("ration_allocator_raft_apply_lag_entries", "Committed entries this node has not applied (commit index - applied index).", nil, nil),
		changes:  prometheus.NewDesc("ration_allocator_raft_leader_changes_total", "Times this node learned of a leader: a new one, or one after a time without.", nil, nil),
		restores: prometheus.NewDesc("ration_allocator_raft_snapshot_restores_total", "Snapshots the ledger restored.", nil, nil),
		contact:  prometheus.NewDesc("ration_allocator_raft_last_contact_seconds", "On a follower, seconds since it last heard from the leader (0 on the leader; from start if never).", nil, nil),
	})
}

var roles = []raft.RaftState{raft.Leader, raft.Follower, raft.Candidate, raft.Shutdown}

// roleName is the role label: raft's state name in lower case.
func roleName(s raft.RaftState) string {
	switch s {
	case raft.Leader:
		return "leader"
	case raft.Follower:
		return "follower"
	case raft.Candidate:
		return "candidate"
	case raft.Shutdown:
		return "shutdown"
	}
	return "unknown"
}

type nodeCollector struct {
	n                                                                  *Node
	role, term, last, commit, applied, lag, changes, restores, contact *prometheus.Desc
}

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.role, c.term, c.last, c.commit, c.applied, c.lag, c.changes, c.restores, c.contact} {
		ch <- d
	}
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.n.raft
	state := r.State()
	for _, s := range roles {
		v := 0.0
		if s == state {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.role, prometheus.GaugeValue, v, roleName(s))
	}
	commit, applied := r.CommitIndex(), c.n.fsm.AppliedIndex()
	ch <- prometheus.MustNewConstMetric(c.term, prometheus.GaugeValue, float64(r.CurrentTerm()))
	ch <- prometheus.MustNewConstMetric(c.last, prometheus.GaugeValue, float64(r.LastIndex()))
	ch <- prometheus.MustNewConstMetric(c.commit, prometheus.GaugeValue, float64(commit))
	ch <- prometheus.MustNewConstMetric(c.applied, prometheus.GaugeValue, float64(applied))
	ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(commit-min(applied, commit)))
	ch <- prometheus.MustNewConstMetric(c.changes, prometheus.CounterValue, float64(c.n.leaderChanges.Load()))
	ch <- prometheus.MustNewConstMetric(c.restores, prometheus.CounterValue, float64(c.n.fsm.Restores()))
	var since float64
	if state != raft.Leader {
		since = time.Since(r.LastContact()).Seconds()
		if r.LastContact().IsZero() {
			since = time.Since(c.n.started).Seconds()
		}
	}
	ch <- prometheus.MustNewConstMetric(c.contact, prometheus.GaugeValue, since)
}
