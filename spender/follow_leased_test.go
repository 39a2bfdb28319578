package spender_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
)

// memTransport serves each request in process with the handler of its
// host, without sockets: a goroutine blocked on a socket is not durably
// blocked in a synctest bubble, so virtual time would not move while a
// connection is open. A host without a handler refuses the connection.
type memTransport map[string]http.Handler

func (m memTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	h, ok := m[r.URL.Host]
	if !ok {
		return nil, fmt.Errorf("dial tcp %s: connection refused", r.URL.Host)
	}
	sr := r.Clone(r.Context())
	sr.RequestURI = r.URL.RequestURI()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, sr)
	if r.Body != nil {
		r.Body.Close()
	}
	return rec.Result(), nil
}

// fakeCluster is three members in front of one in-memory allocator (their
// replicated ledger), reached over memTransport; lead makes one the leader.
type fakeCluster struct {
	j       *journal
	members []*fakeMember
	urls    []string
	list    string // the URLs, comma-separated, for DialAllocator
	hc      *http.Client
}

func newFakeCluster(t *testing.T, svc spender.LeaseSource) *fakeCluster {
	c := &fakeCluster{j: new(journal)}
	mt := memTransport{}
	for i := range 3 {
		m := &fakeMember{name: string(rune('a' + i)), j: c.j, svc: svc}
		host := m.name + ".allocator.test:7450"
		mt[host] = m.handler(true)
		c.members = append(c.members, m)
		c.urls = append(c.urls, "http://"+host)
	}
	c.list = strings.Join(c.urls, ",")
	c.hc = &http.Client{Transport: mt}
	return c
}

// lead makes member k the leader, which the others name; k < 0: no leader,
// and every member says it knows none.
func (c *fakeCluster) lead(k int) {
	for i, m := range c.members {
		switch {
		case i == k:
			m.setRole(role{serves: true})
		case k < 0:
			m.setRole(role{})
		default:
			m.setRole(role{leader: c.urls[k]})
		}
	}
}

// outcome is one request's fate in TestLeasedFollowsTheLeader.
type outcome struct {
	at   time.Duration // since the phase began
	path spender.Path  // "" when rejected
}

// TestLeasedFollowsTheLeader: a leased Limiter on DialAllocator with three
// members, in a synctest bubble as the outage tests run (bubbleClock). The
// leader is b, then c, then there is none, then a. The Limiter's calls
// reach each leader through the member it last heard from, with the same
// request; its epoch never changes and the sequences the leaders serve
// run 1, 2, 3, ... with no gap. While there is no leader it admits from
// its lease, then by its fallback policy (the fallback test's outcomes),
// and is unready; once a leads it is served again.
func TestLeasedFollowsTheLeader(t *testing.T) {
	for _, tc := range []struct {
		policy spender.FallbackPolicy
		admits bool // the policy admits once the lease is gone
		// rejects is how many requests it may refuse first: the share's
		// buckets start empty, and at this spender's share (the whole
		// limit, 10 a second) hold two requests by the next one.
		rejects int
	}{{spender.FallbackShare, true, 1}, {spender.FailOpen, true, 0}, {spender.FailClosed, false, 0}} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var clk bubbleClock
				const ttl = 2 * time.Second
				c := newFakeCluster(t, newAllocator(t, clk, allocator.WithTTL(ttl)))
				c.lead(1)
				src, err := spender.DialAllocator(c.list, spender.WithToken(clusterToken), spender.WithHTTPClient(c.hc))
				if err != nil {
					t.Fatal(err)
				}
				l := newLeased(t, clk, src, spender.WithSpenderID("gw"), spender.WithFallback(tc.policy), testTuning(20*time.Millisecond))
				lim := ration.Limits{RPM: 600} // 10 a second
				// offer sends 5 requests a second for d and returns their outcomes.
				offer := func(d time.Duration) []outcome {
					var out []outcome
					start := clk.Now()
					for clk.Now().Sub(start) < d {
						r, err := l.Reserve(ctx, "k", lim, ration.Amount{Requests: 1})
						o := outcome{at: clk.Now().Sub(start)}
						var rej *spender.RejectError
						switch {
						case err == nil:
							o.path = spender.AdmissionPath(r)
							r.Settle(ration.Amount{Requests: 1})
						case !errors.As(err, &rej):
							t.Fatalf("Reserve: %v", err)
						}
						out = append(out, o)
						clk.Advance(200 * time.Millisecond)
					}
					return out
				}
				admittedAll := func(phase string, out []outcome) {
					t.Helper()
					for _, o := range out {
						if o.path != spender.PathLease && o.path != spender.PathSlow {
							t.Fatalf("%s: a request at +%v was %q, want admitted from a lease: %v", phase, o.at, o.path, out)
						}
					}
				}

				// b leads; the first call goes to a, which names b.
				admittedAll("b leads", offer(3*time.Second))
				first := c.j.since(0)
				if len(first) < 2 || first[0].member != "a" || first[1].member != "b" || !first[1].served || !proto.Equal(first[0].req, first[1].req) {
					t.Fatalf("the first call reached %v, want a then b with the same request", members(first))
				}

				// elect makes member k the leader (none for -1) between two
				// calls: the Limiter's goroutine, woken at the instant the
				// clock reached, has finished what it does then.
				elect := func(k int) {
					synctest.Wait()
					c.lead(k)
				}

				// c leads; the next call goes to b, which names c.
				elect(2)
				n := c.j.len()
				admittedAll("c leads", offer(3*time.Second))
				if v := c.j.since(n); len(v) < 2 || v[0].member != "b" || v[1].member != "c" || !v[1].served || !proto.Equal(v[0].req, v[1].req) {
					t.Fatalf("the first call after c was elected reached %v, want b then c with the same request", members(v))
				}

				// No leader: the lease, then the fallback policy.
				elect(-1)
				out := offer(8 * time.Second)
				lastLease, firstAfter := -1, -1
				for i, o := range out {
					switch {
					case o.path == spender.PathLease || o.path == spender.PathSlow:
						lastLease = i
					case firstAfter < 0:
						firstAfter = i
					}
				}
				if lastLease < 0 || firstAfter < 0 || lastLease > firstAfter || out[lastLease].at > ttl {
					t.Fatalf("without a leader: %v; want admissions from the lease (within the TTL %v), then only the fallback policy", out, ttl)
				}
				for i, o := range out[firstAfter:] {
					if tc.admits != (o.path == spender.PathFallback) && (i >= tc.rejects || o.path != "") {
						t.Fatalf("without a leader, after the lease, under %v: a request at +%v was %q: %v", tc.policy, o.at, o.path, out)
					}
				}
				if err := l.Ready(); !errors.Is(err, spender.ErrAllocatorUnreachable) {
					t.Fatalf("Ready without a leader = %v, want ErrAllocatorUnreachable", err)
				}

				// a leads: served again.
				elect(0)
				if err := l.Flush(ctx); err != nil {
					t.Fatal(err)
				}
				if err := l.Ready(); err != nil {
					t.Fatalf("Ready once a leads: %v", err)
				}
				admittedAll("a leads", offer(3*time.Second))
				if err := l.Close(ctx); err != nil {
					t.Fatal(err)
				}

				// One epoch throughout; every attempt of a sequence carried
				// the same request; the leaders served 1, 2, 3, ... once each.
				all := c.j.since(0)
				epoch := callerOf(all[0].req).GetEpoch()
				bySeq := map[uint64]proto.Message{}
				var served []uint64
				for _, v := range all {
					cl := callerOf(v.req)
					if cl.GetSpenderId() != "gw" || cl.GetEpoch() != epoch {
						t.Fatalf("%s received %v, want spender gw in epoch %d throughout", v.member, cl, epoch)
					}
					if prev, ok := bySeq[cl.GetSequence()]; ok && !proto.Equal(prev, v.req) {
						t.Fatalf("sequence %d was sent with two bodies: %v and %v", cl.GetSequence(), prev, v.req)
					}
					bySeq[cl.GetSequence()] = v.req
					if v.served {
						served = append(served, cl.GetSequence())
					}
				}
				for i, s := range served {
					if s != uint64(i+1) {
						t.Fatalf("the leaders served sequences %v, want 1, 2, 3, ... once each", served)
					}
				}
				if last := all[len(all)-1]; last.member != "a" || last.method != "Release" || !last.served {
					t.Fatalf("the last call was %s at %s (served %v), want the Release served by a", last.method, last.member, last.served)
				}
			})
		})
	}
}

// members lists the members the visits reached, in order.
func members(vs []visit) string {
	var b strings.Builder
	for _, v := range vs {
		fmt.Fprintf(&b, "%s(%s %d served:%v) ", v.member, v.method, callerOf(v.req).GetSequence(), v.served)
	}
	return b.String()
}

// callerOf is a lease request's caller.
func callerOf(m proto.Message) *leasev1.Caller {
	return m.(interface{ GetCaller() *leasev1.Caller }).GetCaller()
}
