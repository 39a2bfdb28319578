package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// gauge scrapes reg and returns the value of the metric name (with the
// label role=role when role is not ""); it fails the test if absent.
func gauge(t *testing.T, reg *prometheus.Registry, name, role string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if role != "" && (len(m.GetLabel()) != 1 || m.GetLabel()[0].GetValue() != role) {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s{role=%q}", name, role)
	return 0
}

func roleText(role string) string {
	var b strings.Builder
	b.WriteString("# HELP ration_allocator_raft_role 1 for this node's raft role, 0 for the others.\n# TYPE ration_allocator_raft_role gauge\n")
	for _, r := range []string{"candidate", "follower", "leader", "shutdown"} {
		v := 0
		if r == role {
			v = 1
		}
		fmt.Fprintf(&b, "ration_allocator_raft_role{role=%q} %d\n", r, v)
	}
	return b.String()
}

// pollUntil polls cond every 2 ms until it holds or waitFor passes.
func pollUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, waitFor)
		}
		time.Sleep(2 * time.Millisecond) // poll interval
	}
}

// Three nodes, each scraped from its own registry: the leader reports the
// leader role and the others the follower role, all the same term, the
// applied index catches up with the leader's commit index (lag 0); after
// a failover the survivors count one more leader change, the new leader
// reports its role and the stopped node the shutdown role.
func TestNodeMetrics(t *testing.T) {
	c := newCluster(t, 3)
	regs := make([]*prometheus.Registry, len(c.nodes))
	for i, nd := range c.nodes {
		regs[i] = prometheus.NewRegistry()
		if err := nd.RegisterMetrics(regs[i]); err != nil {
			t.Fatal(err)
		}
		if err := nd.RegisterMetrics(prometheus.NewRegistry()); err != nil {
			t.Fatalf("a second registry: %v", err)
		}
	}
	w := newWorkload(t)
	w.run(c, 20, 4)
	ld := c.leader()
	w.check(c.converge())

	for i, nd := range c.nodes {
		if problems, err := testutil.GatherAndLint(regs[i]); err != nil || len(problems) > 0 {
			t.Fatalf("lint: %v %+v", err, problems)
		}
		role := "follower"
		if nd == ld {
			role = "leader"
		}
		if err := testutil.GatherAndCompare(regs[i], strings.NewReader(roleText(role)), "ration_allocator_raft_role"); err != nil {
			t.Fatalf("%s: %v", nd.ID(), err)
		}
	}
	var li int
	for i, nd := range c.nodes {
		if nd == ld {
			li = i
		}
	}
	term := gauge(t, regs[li], "ration_allocator_raft_term", "")
	commit := gauge(t, regs[li], "ration_allocator_raft_commit_index", "")
	if term < 1 || commit < 7 { // the configuration, a no-op, 20 commands in 5 entries
		t.Fatalf("leader: term %v, commit index %v", term, commit)
	}
	for i, nd := range c.nodes {
		if got := gauge(t, regs[i], "ration_allocator_raft_term", ""); got != term {
			t.Fatalf("%s: term %v, leader's %v", nd.ID(), got, term)
		}
		pollUntil(t, fmt.Sprintf("%s applies up to %v", nd.ID(), commit), func() bool {
			return gauge(t, regs[i], "ration_allocator_raft_applied_index", "") == commit &&
				gauge(t, regs[i], "ration_allocator_raft_commit_index", "") == commit &&
				gauge(t, regs[i], "ration_allocator_raft_apply_lag_entries", "") == 0
		})
		if last := gauge(t, regs[i], "ration_allocator_raft_last_log_index", ""); last < commit {
			t.Fatalf("%s: last log index %v < commit index %v", nd.ID(), last, commit)
		}
		if got := gauge(t, regs[i], "ration_allocator_raft_leader_changes_total", ""); got < 1 {
			t.Fatalf("%s: %v leader changes, want at least the first leader", nd.ID(), got)
		}
		contact := gauge(t, regs[i], "ration_allocator_raft_last_contact_seconds", "")
		if i == li && contact != 0 || i != li && (contact < 0 || contact > 5) {
			t.Fatalf("%s: last contact %vs (leader: %v), want 0 on the leader and a heartbeat's age on a follower", nd.ID(), contact, i == li)
		}
	}

	before := make([]float64, len(c.nodes))
	for i := range c.nodes {
		before[i] = gauge(t, regs[i], "ration_allocator_raft_leader_changes_total", "")
	}
	c.shutdown(li)
	nl := c.leader()
	w.run(c, 3, 1)
	for i, nd := range c.nodes {
		if i == li {
			if err := testutil.GatherAndCompare(regs[i], strings.NewReader(roleText("shutdown")), "ration_allocator_raft_role"); err != nil {
				t.Fatalf("stopped %s: %v", nd.ID(), err)
			}
			continue
		}
		pollUntil(t, fmt.Sprintf("%s counts the new leader", nd.ID()), func() bool {
			return gauge(t, regs[i], "ration_allocator_raft_leader_changes_total", "") > before[i]
		})
		if nd == nl {
			if got := gauge(t, regs[i], "ration_allocator_raft_role", "leader"); got != 1 {
				t.Fatalf("new leader %s: role leader %v", nd.ID(), got)
			}
			if got := gauge(t, regs[i], "ration_allocator_raft_last_contact_seconds", ""); got != 0 {
				t.Fatalf("new leader %s: last contact %vs, want 0 on a leader", nd.ID(), got)
			}
			if got := gauge(t, regs[i], "ration_allocator_raft_term", ""); got <= term {
				t.Fatalf("new leader %s: term %v, not past %v", nd.ID(), got, term)
			}
		}
	}
}
