package spender_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect/v2"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/internal/testkit"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// clusterToken is the bearer token every fake member requires.
const clusterToken = "s3cret"

// role is what a fake member answers: it serves the call, or refuses it as
// a member that is not the leader, naming leader ("" for none).
type role struct {
	serves bool
	leader string
}

// visit is one request a fake member received.
type visit struct {
	member string // the member's name
	method string
	req    proto.Message
	served bool // the member served it (it was the leader)
}

// journal records, in order, the requests every member of a fake cluster
// received.
type journal struct {
	mu     sync.Mutex // guards visits
	visits []visit
}

func (j *journal) add(v visit) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.visits = append(j.visits, v)
}

// since returns the visits after the first n.
func (j *journal) since(n int) []visit {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]visit(nil), j.visits[n:]...)
}

func (j *journal) len() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.visits)
}

// fakeMember is a LeaseService handler scripted by its role: serving, it
// passes the call to svc (an empty reply when svc is nil); otherwise it
// answers NOT_LEADER as protocol.go says a cluster member does.
type fakeMember struct {
	name string
	j    *journal
	svc  spender.LeaseSource

	mu   sync.Mutex // guards role
	role role
}

func (m *fakeMember) setRole(r role) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.role = r
}

// enter records req and returns the member's refusal, or nil to serve.
func (m *fakeMember) enter(method string, req proto.Message) error {
	m.mu.Lock()
	r := m.role
	m.mu.Unlock()
	m.j.add(visit{member: m.name, method: method, req: proto.Clone(req), served: r.serves})
	if r.serves {
		return nil
	}
	return testkit.NotLeader(r.leader)
}

func (m *fakeMember) Acquire(ctx context.Context, r *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	if err := m.enter("Acquire", r); err != nil || m.svc == nil {
		return &leasev1.AcquireResponse{}, err
	}
	return m.svc.Acquire(ctx, r)
}

func (m *fakeMember) ReserveAhead(ctx context.Context, r *leasev1.ReserveAheadRequest) (*leasev1.ReserveAheadResponse, error) {
	if err := m.enter("ReserveAhead", r); err != nil || m.svc == nil {
		return &leasev1.ReserveAheadResponse{}, err
	}
	return m.svc.ReserveAhead(ctx, r)
}

func (m *fakeMember) Release(ctx context.Context, r *leasev1.ReleaseRequest) (*leasev1.ReleaseResponse, error) {
	if err := m.enter("Release", r); err != nil || m.svc == nil {
		return &leasev1.ReleaseResponse{}, err
	}
	return m.svc.Release(ctx, r)
}

// handler serves m's lease API, requiring clusterToken when auth is set.
func (m *fakeMember) handler(auth bool) http.Handler {
	mux := http.NewServeMux()
	var ics []connect.ServerInterceptor
	if auth {
		ics = append(ics, allocator.BearerAuth([]string{clusterToken}, nil))
	}
	allocator.Mount(mux, m, ics...)
	return mux
}

// h2cClient is testkit.H2CClient, whose connections close when the test
// ends, before the servers it reached shut down (which would otherwise wait
// for them).
func h2cClient(t *testing.T) *http.Client {
	hc := testkit.H2CClient()
	t.Cleanup(hc.CloseIdleConnections)
	return hc
}

// refusing returns the URL of a loopback port that accepts connections and
// closes them at once: a member that is down.
func refusing(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return "http://" + ln.Addr().String()
}

// Roles in a followCase: a member at index k >= 0 names member k as the
// leader; the negative values are the other roles.
const (
	serves    = -1 // grants
	noneKnown = -2 // NOT_LEADER naming no leader
	outsider  = -3 // NOT_LEADER naming a lease API that is not in the list
	down      = -4 // refuses connections (only as a member's first role)
)

// followStep is one call and what it must do.
type followStep struct {
	roles  []int  // the members' roles from this call on; nil keeps them
	method string // "" is Acquire
	visits string // the members that received the call, in order (x: the server outside the list)
	fails  bool   // the call fails (Unavailable, or Canceled for a connection reset)
}

// TestDialAllocatorFollowsTheLeader: the several-address source sends each
// call to the member that answered last, on to the leader a member names
// (the same request, at most twice per attempt, only to a listed member),
// and after a failure starts the next call at the next member. Each call
// here carries its own sequence; every member it reached saw that
// sequence and body. The redirect metrics and the leader gauge follow.
func TestDialAllocatorFollowsTheLeader(t *testing.T) {
	for _, tc := range []struct {
		name      string
		first     []int // the members' roles at the start
		steps     []followStep
		redirects map[string]float64 // leader_redirects_total by result at the end
		leader    string             // the member allocator_leader shows at the end; "" none
	}{
		{
			name:  "the leader is listed first",
			first: []int{serves, 0, 0},
			steps: []followStep{{visits: "a"}, {visits: "a"}, {method: "Release", visits: "a"}},
			// leader_redirects_total has no series.
			leader: "a",
		}, {
			name:      "a follower names the leader",
			first:     []int{1, serves, 1},
			steps:     []followStep{{visits: "ab"}, {visits: "b"}, {method: "ReserveAhead", visits: "b"}},
			redirects: map[string]float64{"followed": 1},
			leader:    "b",
		}, {
			name:  "the leader changes",
			first: []int{serves, 0, 0},
			steps: []followStep{
				{visits: "a"},
				{roles: []int{2, 2, serves}, visits: "ac"},
				{visits: "c"},
				{roles: []int{1, serves, 1}, method: "Release", visits: "cb"},
			},
			redirects: map[string]float64{"followed": 2},
			leader:    "b",
		}, {
			name:  "no leader: each call fails and the next starts at the next member",
			first: []int{noneKnown, noneKnown, noneKnown},
			steps: []followStep{
				{visits: "a", fails: true},
				{visits: "b", fails: true},
				{method: "Release", visits: "c", fails: true},
				{visits: "a", fails: true},
				{roles: []int{noneKnown, noneKnown, serves}, visits: "b", fails: true},
				{visits: "c"},
				{visits: "c"},
			},
			leader: "c",
		}, {
			name:   "a member that is down is passed over",
			first:  []int{down, serves, 1},
			steps:  []followStep{{visits: "", fails: true}, {visits: "b"}, {visits: "b"}},
			leader: "b",
		}, {
			name:  "the named leader is down until another is elected",
			first: []int{1, down, 1},
			steps: []followStep{
				{visits: "a", fails: true}, // a names b, which is down
				{visits: "", fails: true},  // this call starts at b
				{roles: []int{2, down, serves}, visits: "c"},
				{visits: "c"},
			},
			redirects: map[string]float64{"followed": 1},
			leader:    "c",
		}, {
			name:  "a redirect loop is cut after two redirects",
			first: []int{1, 0, serves},
			steps: []followStep{
				{visits: "aba", fails: true},
				{visits: "bab", fails: true},
				{visits: "c"},
			},
			redirects: map[string]float64{"followed": 4, "limit": 2},
			leader:    "c",
		}, {
			name:  "a leader outside the list is not followed",
			first: []int{outsider, serves, outsider},
			steps: []followStep{
				{visits: "a", fails: true},
				{visits: "b"},
				{roles: []int{outsider, outsider, serves}, visits: "b", fails: true},
				{visits: "c"},
			},
			redirects: map[string]float64{"outside": 2},
			leader:    "c",
		}, {
			name:   "a member naming itself knows no leader",
			first:  []int{0, serves, 1},
			steps:  []followStep{{visits: "a", fails: true}, {visits: "b"}},
			leader: "b",
		}, {
			name:  "one URL: every call goes to it, as before clusters",
			first: []int{serves},
			steps: []followStep{
				{visits: "a"},
				{roles: []int{noneKnown}, visits: "a", fails: true},
				{visits: "a", fails: true},
				{roles: []int{outsider}, visits: "a", fails: true},
				{roles: []int{0}, visits: "a", fails: true},
				{roles: []int{serves}, visits: "a"},
			},
			redirects: map[string]float64{"outside": 1},
			leader:    "a",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := new(journal)
			outside := &fakeMember{name: "x", j: j, role: role{serves: true}}
			outsideURL := testkit.H2C(t, outside.handler(false)) // no token needed: a call sent here would be recorded
			members := make([]*fakeMember, len(tc.first))
			urls := make([]string, len(tc.first))
			for i, r := range tc.first {
				members[i] = &fakeMember{name: string(rune('a' + i)), j: j}
				if r == down {
					urls[i] = refusing(t)
				} else {
					urls[i] = testkit.H2C(t, members[i].handler(true))
				}
			}
			setRoles := func(roles []int) {
				for i, r := range roles {
					switch {
					case r == serves:
						members[i].setRole(role{serves: true})
					case r == noneKnown, r == down:
						members[i].setRole(role{})
					case r == outsider:
						members[i].setRole(role{leader: outsideURL})
					default:
						members[i].setRole(role{leader: urls[r] + "/"}) // a trailing slash is the same URL
					}
				}
			}
			setRoles(tc.first)
			reg := prometheus.NewPedanticRegistry()
			m, err := spender.NewMetrics(reg)
			if err != nil {
				t.Fatal(err)
			}
			src, err := spender.DialAllocator(strings.Join(urls, ", "), spender.WithToken(clusterToken), spender.WithSourceMetrics(m),
				spender.WithHTTPClient(h2cClient(t)))
			if err != nil {
				t.Fatal(err)
			}
			for s, st := range tc.steps {
				if st.roles != nil {
					setRoles(st.roles)
				}
				before := j.len()
				caller := &leasev1.Caller{SpenderId: "gw", Epoch: 7, Sequence: uint64(s + 1)}
				var req proto.Message
				var err error
				switch st.method {
				case "", "Acquire":
					r := &leasev1.AcquireRequest{Caller: caller, Keys: []*leasev1.KeyAcquire{{Key: "k", Demand: &leasev1.Amount{Requests: int64(s + 1)}}}}
					req, st.method = r, "Acquire"
					_, err = src.Acquire(ctx, r)
				case "ReserveAhead":
					r := &leasev1.ReserveAheadRequest{Caller: caller}
					req = r
					_, err = src.ReserveAhead(ctx, r)
				case "Release":
					r := &leasev1.ReleaseRequest{Caller: caller}
					req = r
					_, err = src.Release(ctx, r)
				}
				if code := connect.CodeOf(err); (err != nil) != st.fails || err != nil && code != connect.CodeUnavailable && code != connect.CodeCanceled {
					t.Fatalf("call %d (%s): %v, want it to fail: %v", s+1, st.method, err, st.fails)
				}
				visits := j.since(before)
				var got strings.Builder
				for _, v := range visits {
					got.WriteString(v.member)
					if v.method != st.method || !proto.Equal(v.req, req) {
						t.Errorf("call %d: member %s received %s %v, want the call's own %s %v", s+1, v.member, v.method, v.req, st.method, req)
					}
				}
				if got.String() != st.visits {
					t.Fatalf("call %d (%s) reached %q, want %q", s+1, st.method, got.String(), st.visits)
				}
			}
			if got := labelValues(t, reg, "ration_spender_leader_redirects_total", "result"); !equalCounts(got, tc.redirects) {
				t.Errorf("leader_redirects_total = %v, want %v", got, tc.redirects)
			}
			leaders := labelValues(t, reg, "ration_spender_allocator_leader", "member")
			if len(leaders) != len(urls) {
				t.Errorf("allocator_leader has %d series, want one per member (%d): %v", len(leaders), len(urls), leaders)
			}
			for i, u := range urls {
				want := 0.0
				if tc.leader == members[i].name {
					want = 1
				}
				if got, ok := leaders[u]; !ok || got != want {
					t.Errorf("allocator_leader{member=%q} = %v (present %v), want %v", u, got, ok, want)
				}
			}
		})
	}
}

// equalCounts compares two label→value maps, a nil or empty one meaning
// no series.
func equalCounts(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// labelValues returns the value of every series of the family name (a
// counter or a gauge) by its label label.
func labelValues(t *testing.T, g prometheus.Gatherer, name, label string) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					out[lp.GetValue()] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

// TestDialAllocatorMembers: the list's form is checked, and a bad list is
// refused with an error naming the problem.
func TestDialAllocatorMembers(t *testing.T) {
	for _, tc := range []struct {
		list string
		want string // "" accepted, else a part of the error
	}{
		{"http://a:7450", ""},
		{"http://a:7450,http://b:7450,http://c:7450", ""},
		{" https://a:7450/ , https://B:7450 ", ""},
		{"http://a:7450,", "want http://host:port"},
		{",http://a:7450", "want http://host:port"},
		{"http://a:7450,,http://b:7450", "want http://host:port"},
		{"http://a:7450,b:7450", "want http://host:port"},
		{"http://a:7450,https://b:7450", "same scheme"},
		{"http://a:7450,http://A:7450/", "listed twice"},
		{"http://a,http://a:80", "listed twice"},
	} {
		_, err := spender.DialAllocator(tc.list)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("DialAllocator(%q): %v", tc.list, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("DialAllocator(%q) = %v, want an error containing %q", tc.list, err, tc.want)
		}
	}
}

// TestDialAllocatorFollowsConcurrently: calls from several goroutines while
// the leader moves between members all end in an answer or NOT_LEADER,
// and once the leader stays put every call is served (run under -race).
func TestDialAllocatorFollowsConcurrently(t *testing.T) {
	j := new(journal)
	members := make([]*fakeMember, 3)
	urls := make([]string, 3)
	for i := range members {
		members[i] = &fakeMember{name: string(rune('a' + i)), j: j}
		urls[i] = testkit.H2C(t, members[i].handler(true))
	}
	lead := func(k int) {
		for i, m := range members {
			if i == k {
				m.setRole(role{serves: true})
			} else {
				m.setRole(role{leader: urls[k]})
			}
		}
	}
	lead(0)
	src, err := spender.DialAllocator(strings.Join(urls, ","), spender.WithToken(clusterToken), spender.WithHTTPClient(h2cClient(t)))
	if err != nil {
		t.Fatal(err)
	}
	call := func(seq int) error {
		_, err := src.Acquire(ctx, &leasev1.AcquireRequest{Caller: &leasev1.Caller{SpenderId: "gw", Epoch: 1, Sequence: uint64(seq)}})
		return err
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 30 {
				if err := call(g*100 + i + 1); err != nil {
					if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "not the leader") {
						t.Errorf("goroutine %d call %d: %v, want an answer or NOT_LEADER", g, i, err)
					}
				}
			}
		})
	}
	for k := range 30 {
		lead(k % 3)
	}
	wg.Wait()
	lead(1)
	for i := range 10 {
		// The first call may need both redirects (it starts where the last
		// answer came from); none fails.
		if err := call(1000 + i); err != nil {
			t.Fatalf("call %d after the leader settled: %v", i, err)
		}
	}
	before := j.len()
	if err := call(2000); err != nil {
		t.Fatal(err)
	}
	if v := j.since(before); len(v) != 1 || v[0].member != "b" {
		t.Fatalf("a call once the leader settled reached %v, want b alone", v)
	}
}
